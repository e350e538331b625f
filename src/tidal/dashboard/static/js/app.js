// The app shell: a hash router over the pages. Each page module exports
// `render(view, params)` and returns a function that stops it (timers, streams, charts).
import * as api from "./api.js";
import * as clusterPage from "./cluster.js";
import * as jobPage from "./job.js";
import * as jobsPage from "./jobs.js";
import * as modelsPage from "./models.js";
import * as submitPage from "./submit.js";

// [hash, page, nav link, whether the page needs the job list read before it draws].
// Job colours follow each job's place in the list: the job page sets its colour once, so
// the list is read (only what changed since the last read) first; the jobs and cluster
// pages read it themselves before drawing any job.
const ROUTES = [
  [/^#\/jobs\/([^/]+)$/, jobPage, "jobs", true],
  [/^#\/cluster$/, clusterPage, "cluster", false],
  [/^#\/submit$/, submitPage, "submit", false],
  [/^#\/jobs$/, jobsPage, "jobs", false],
  [/^#\/models\/([^/]+)$/, modelsPage, "models", false],
  [/^#\/models$/, modelsPage, "models", false],
];

const view = document.getElementById("view");
let stop = null;
let routing = 0;

async function route() {
  const hash = location.hash || "#/jobs";
  const found = ROUTES.find(([pattern]) => pattern.test(hash));
  if (!found) {
    location.hash = "#/jobs";
    return;
  }
  const [pattern, page, nav, needsOrder] = found;
  const params = hash.match(pattern).slice(1).map(decodeURIComponent);
  if (stop) stop();
  stop = null;
  view.replaceChildren();
  const mine = ++routing;
  if (needsOrder) {
    try {
      await api.jobs();
    } catch {
      // the page's own polling shows the failure
    }
    if (mine !== routing) return; // a newer navigation wins
  }
  for (const a of document.querySelectorAll("[data-nav]")) {
    a.classList.toggle("active", a.dataset.nav === nav);
  }
  stop = page.render(view, ...params) || null;
}

// Who is logged in, beside the logout button: "ana (member, team vision)".
api.api("/me")
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
