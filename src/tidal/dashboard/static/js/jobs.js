// Jobs: every job with its state, priority, workers, progress and times; filtered here in
// the browser, refreshed every POLL_MS.
import * as api from "./api.js";
import {
  badge, clock, duration, fill, h, jobColour, jobLink, labelChips, timeCell, workerCounts,
} from "./dom.js";
import { every, POLL_MS } from "./poll.js";

const STATES = ["queued", "running", "rescaling", "succeeded", "failed", "cancelled"];
const ACTIVE = new Set(["queued", "running", "rescaling"]);
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

// Filters survive navigating to a job and back.
const filters = { state: "active", text: "" };

function matches(job) {
  if (filters.state === "active" && !ACTIVE.has(job.state)) return false;
  if (filters.state !== "active" && filters.state !== "all" && job.state !== filters.state) {
    return false;
  }
  const text = filters.text.trim().toLowerCase();
  if (!text) return true;
  const labels = Object.entries(job.labels).map(([k, v]) => `${k}=${v}`);
  return [job.id, job.name, ...labels].some((s) => s.toLowerCase().includes(text));
}

function workersCell(job) {
  // now / min–max, with a bar of the current size against max.
  const bar = h("span", { class: "bar" },
    h("span", {
      class: "bar-fill",
      style: `width:${(100 * job.workers) / job.max_slots}%;background:${jobColour(job.id)}`,
    }));
  const counts = workerCounts(job);
  // A finished job holds nothing and moves no more: the target it last had is history.
  const target = !TERMINAL.has(job.state) && counts.target !== null && counts.target !== counts.now
    ? h("span", { class: "muted", title: "target" }, ` → ${counts.target}`) : null;
  const wide = counts.slots_per_worker > 1
    ? h("span", { class: "muted", title: "slots (GPUs) per worker" }, ` ×${counts.slots_per_worker}`)
    : null;
  return h("td", { class: "workers" },
    h("span", { class: "num" }, `${counts.now}`), target,
    h("span", { class: "muted" }, ` / ${counts.min}–${counts.max}`), wide, bar);
}

function progressCell(job, latest) {
  if (!latest) return h("td", { class: "muted" }, "–");
  const p = latest.values.progress;
  const extra = Object.entries(latest.values)
    .filter(([k]) => k !== "progress")
    .slice(0, 2)
    .map(([k, v]) => `${k} ${Number(v).toPrecision(3)}`)
    .join(" · ");
  if (p === undefined) {
    return h("td", {}, `step ${latest.step}`, extra ? h("div", { class: "muted small" }, extra) : null);
  }
  const pct = Math.round(Math.min(1, Math.max(0, p)) * 100);
  return h("td", {},
    h("span", { class: "bar wide" }, h("span", { class: "bar-fill", style: `width:${pct}%` })),
    ` ${pct}%`, h("div", { class: "muted small" }, `step ${latest.step}${extra ? ` · ${extra}` : ""}`));
}

function row(job, latest) {
  const ran = job.started_at ? (job.finished_at ?? Date.now() / 1000) - job.started_at : null;
  return h("tr", { dataset: { job: job.id, state: job.state } },
    h("td", {},
      h("span", { class: "swatch", style: `background:${jobColour(job.id)}` }),
      jobLink(job.id, job.name), h("div", { class: "muted small" }, job.id), labelChips(job.labels)),
    // "cancelling" while a cancel is under way; once the job has ended its state says it all.
    h("td", {}, badge(job.state),
      job.cancel_requested && !TERMINAL.has(job.state) ? h("span", { class: "muted small cancelling" }, " cancelling") : null,
      h("div", { class: "muted small reason", title: job.reason }, job.reason)),
    h("td", { class: "num" }, job.priority),
    workersCell(job),
    progressCell(job, latest),
    timeCell(job.submitted_at),
    h("td", { class: "time" }, clock(job.started_at),
      ran !== null ? h("div", { class: "muted small" }, `for ${duration(ran)}`) : null),
    timeCell(job.finished_at),
  );
}

export function render(view) {
  const counts = h("span", { class: "muted", id: "job-counts" });
  const stateSelect = h("select", { id: "filter-state", "aria-label": "State" },
    ["active", "all", ...STATES].map((s) => h("option", { value: s, selected: s === filters.state }, s)));
  const search = h("input", {
    id: "filter-text", type: "search", placeholder: "name, id or label=value", value: filters.text,
  });
  const body = h("tbody");
  const table = h("table", { class: "jobs", id: "jobs-table" },
    h("thead", {}, h("tr", {},
      ["Job", "State", "Priority", "Workers now / min–max", "Progress", "Submitted", "Started", "Ended"]
        .map((t) => h("th", {}, t)))),
    body);
  const empty = h("p", { class: "empty", hidden: true });
  view.append(
    h("div", { class: "page-head" }, h("h1", {}, "Jobs"), counts),
    h("div", { class: "filters" }, h("label", {}, "State ", stateSelect), search,
      h("a", { href: "#/submit", class: "button" }, "Submit a job")),
    h("div", { class: "card flush" }, table, empty),
  );

  let jobs = [];
  let latest = new Map();
  const draw = () => {
    const shown = jobs.filter(matches);
    fill(body, shown.map((j) => row(j, latest.get(j.id))));
    const byState = STATES.map((s) => [s, jobs.filter((j) => j.state === s).length]).filter(([, n]) => n);
    counts.textContent = byState.map(([s, n]) => `${n} ${s}`).join(" · ");
    empty.hidden = shown.length > 0;
    empty.textContent = jobs.length ? "No job matches the filters." : "No jobs yet.";
  };
  stateSelect.addEventListener("change", () => { filters.state = stateSelect.value; draw(); });
  search.addEventListener("input", () => { filters.text = search.value; draw(); });

  return every(POLL_MS, async () => {
    const [list, prog] = await Promise.all([api.jobs(), api.progress()]);
    jobs = list.reverse(); // newest first
    latest = new Map(prog.map((p) => [p.job_id, p]));
    draw();
  });
}
