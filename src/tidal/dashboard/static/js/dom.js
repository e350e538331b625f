// Small helpers for building the page: elements (text is always set as text, never as
// HTML, so names, messages and logs cannot inject markup), times and job colours.

/** h("td", {class: "x", onclick: f}, child, "text", ...) → element. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Replace an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  for (const child of children.flat(Infinity)) if (child) el.append(child);
  return el;
}

/** "14:02:11" today, "Mar 3 14:02" otherwise; "–" for none. */
export function clock(ts) {
  if (ts === null || ts === undefined) return "–";
  const d = new Date(ts * 1000);
  const today = new Date().toDateString() === d.toDateString();
  return today
    ? d.toLocaleTimeString([], { hour12: false })
    : d.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
}

/** "42s", "3m 10s", "2h 5m". */
export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

/** A time cell: the clock time, the full date on hover. */
export function timeCell(ts) {
  return h("td", { class: "time", title: ts ? new Date(ts * 1000).toString() : "" }, clock(ts));
}

/** The state as a coloured badge. */
export function badge(state) {
  return h("span", { class: `badge state-${state}` }, state);
}

// Job colours: the n-th job ever submitted gets the hue n × the golden angle, so however
// many jobs are shown, consecutive ones are spread round the colour wheel and none repeats;
// the shade (readable on white and under white text) alternates every lap. A job keeps
// its number, hence its colour, on every page: jobs are never removed from the store.
const GOLDEN_ANGLE = 137.50776405003785;
const order = new Map();

/** Learn each job's number from every job in submission order (what `api.jobs()` returns). */
export function learnJobOrder(jobs) {
  jobs.forEach((job, i) => order.set(job.id, i));
}

/** The n-th job's colour. */
export function nthColour(n) {
  const hue = (n * GOLDEN_ANGLE) % 360;
  const lightness = Math.floor((n * GOLDEN_ANGLE) / 360) % 2 ? 36 : 46;
  return `hsl(${hue.toFixed(2)} 70% ${lightness}%)`;
}

/** A stable colour per job id, the same on every page (grey until the job list is read). */
export function jobColour(id) {
  const n = order.get(id);
  return n === undefined ? "#64748b" : nthColour(n);
}

/** A job's labels as `key=value` chips (none: nothing). */
export function labelChips(labels) {
  const entries = Object.entries(labels || {});
  if (!entries.length) return null;
  return h("span", { class: "labels" },
    entries.map(([k, v]) => h("span", { class: "label-chip", dataset: { label: k } }, `${k}=${v}`)));
}

/** Link to a job's page. */
export function jobLink(id, text = id) {
  return h("a", { href: `#/jobs/${encodeURIComponent(id)}` }, text);
}

// A job's size in workers (processes): the server's count, or one worker a slot from a
// server that does not send it.
export function workerCounts(job) {
  return job.worker_counts ?? {
    now: job.workers, min: job.min_slots, max: job.max_slots, target: job.target_slots,
    slots_per_worker: 1,
  };
}
