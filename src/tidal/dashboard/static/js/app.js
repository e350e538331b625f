// The app shell: a hash router over the pages. Each page module exports
// `render(view, params)` and returns a function that stops it (timers, streams, charts).
import { api } from "./api.js";
import * as clusterPage from "./cluster.js";
import * as jobPage from "./job.js";
import * as jobsPage from "./jobs.js";
import * as submitPage from "./submit.js";

const ROUTES = [
  [/^#\/jobs\/([^/]+)$/, jobPage, "jobs"],
  [/^#\/cluster$/, clusterPage, "cluster"],
  [/^#\/submit$/, submitPage, "submit"],
  [/^#\/jobs$/, jobsPage, "jobs"],
];

const view = document.getElementById("view");
let stop = null;

function route() {
  const hash = location.hash || "#/jobs";
  const found = ROUTES.find(([pattern]) => pattern.test(hash));
  if (!found) {
    location.hash = "#/jobs";
    return;
  }
  const [pattern, page, nav] = found;
  const params = hash.match(pattern).slice(1).map(decodeURIComponent);
  if (stop) stop();
  view.replaceChildren();
  for (const a of document.querySelectorAll("[data-nav]")) {
    a.classList.toggle("active", a.dataset.nav === nav);
  }
  stop = page.render(view, ...params) || null;
}

// Who is logged in, beside the logout button: "ana (member, team vision)".
api("/me")
  .then((me) => {
    document.getElementById("who").textContent = `${me.name} (${me.role}, team ${me.team})`;
  })
  .catch(() => {});

document.getElementById("logout").addEventListener("click", async () => {
  await fetch("/logout", { method: "POST", credentials: "same-origin" });
  location.href = "/login";
});

window.addEventListener("hashchange", route);
route();
