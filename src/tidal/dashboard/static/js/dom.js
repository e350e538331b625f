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

// Distinct colours, readable on white and under white text.
const PALETTE = [
  "#2563eb", "#db2777", "#059669", "#d97706", "#7c3aed",
  "#0891b2", "#dc2626", "#65a30d", "#c026d3", "#475569",
];

/** A stable colour per job id, the same on every page. */
export function jobColour(id) {
  let hash = 0;
  for (const c of id) hash = (hash * 31 + c.charCodeAt(0)) >>> 0;
  return PALETTE[hash % PALETTE.length];
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
