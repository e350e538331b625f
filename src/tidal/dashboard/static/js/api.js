// Every call the pages make to the REST API. The browser sends the login cookie; the
// extra header tells the server the request comes from this app (it refuses cookie-
// authenticated changes without it, so other sites cannot forge them).

import { learnJobOrder } from "./dom.js";

export class ApiError extends Error {
  constructor(status, detail) {
    super(ApiError.describe(detail) || `HTTP ${status}`);
    this.status = status;
    this.detail = detail;
  }

  static describe(detail) {
    if (Array.isArray(detail)) {
      return detail.map((d) => (d.path ? `${d.path}: ${d.msg}` : d.msg)).join("; ");
    }
    return typeof detail === "string" ? detail : "";
  }
}

function request(path, { method = "GET", json, yaml, signal } = {}) {
  const headers = { "X-Tidal-Request": "1" };
  let body;
  if (yaml !== undefined) {
    headers["Content-Type"] = "application/yaml";
    body = yaml;
  } else if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(json);
  }
  return fetch(path, { method, headers, body, signal, credentials: "same-origin" });
}

/** Call the API; resolves to parsed JSON (or text), rejects with ApiError. */
export async function api(path, options = {}) {
  const response = await request(path, options);
  if (response.status === 401) {
    // The token changed or the cookie expired: back to the login page.
    location.href = "/login";
    throw new ApiError(401, "not logged in");
  }
  if (!response.ok) {
    let detail = response.statusText;
    try {
      detail = (await response.json()).detail;
    } catch {
      // not JSON: keep the status text
    }
    throw new ApiError(response.status, detail);
  }
  if (response.status === 204) return null;
  const type = response.headers.get("content-type") || "";
  return type.includes("json") ? response.json() : response.text();
}

/** Stream a text response chunk by chunk (followed logs) until it ends or is aborted. */
export async function stream(path, onText, signal) {
  const response = await request(path, { signal });
  if (!response.ok) throw new ApiError(response.status, response.statusText);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    onText(decoder.decode(value, { stream: true }));
  }
}

/** What the list read so far: each job by id, and the change cursor to ask from next. */
const known = { jobs: new Map(), since: null };

/** One `GET /jobs` page, or the login page when the session is over. */
async function jobPage(query) {
  const response = await request(query);
  if (response.status === 401) {
    location.href = "/login";
    throw new ApiError(401, "not logged in");
  }
  if (!response.ok) throw new ApiError(response.status, response.statusText);
  return { list: await response.json(), headers: response.headers };
}

/** The read of the job list under way, if any. */
let reading = null;

/** Every job (summary view), in submission order. The first call reads every page
 *  (`X-Next-Cursor`); later ones ask only for the jobs changed since the previous call
 *  (`since` = its `X-Change-Cursor`), so each poll costs what changed, not every job. */
export function jobs() {
  // Pages and the router ask at once on a navigation: they share one read (each gets
  // its own array: pages reorder theirs).
  if (!reading) reading = readJobs().finally(() => { reading = null; });
  return reading.then((all) => all.slice());
}

async function readJobs() {
  const limit = 1000;
  if (known.since === null) {
    const found = new Map();
    let after = null;
    let since = null;
    for (;;) {
      const query = `/jobs?limit=${limit}${after ? `&after=${encodeURIComponent(after)}` : ""}`;
      const { list, headers } = await jobPage(query);
      for (const job of list) found.set(job.id, job);
      // The first page's cursor was read before any page: a change after it is seen next time.
      if (since === null) since = headers.get("X-Change-Cursor");
      after = headers.get("X-Next-Cursor");
      if (!after) break;
    }
    known.jobs = found;
    known.since = since;
  } else {
    for (;;) {
      const { list, headers } = await jobPage(`/jobs?limit=${limit}&since=${known.since}`);
      for (const job of list) known.jobs.set(job.id, job);
      known.since = headers.get("X-Change-Cursor");
      if (list.length < limit) break; // a full page: more changed jobs follow
    }
  }
  const all = [...known.jobs.values()].sort(
    (a, b) => a.submitted_at - b.submitted_at || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0),
  );
  learnJobOrder(all); // each job's colour follows from its place in this order
  return all;
}
export const progress = () => api("/progress");
export const job = (id) => api(`/jobs/${encodeURIComponent(id)}`);
export const allocations = (id) => api(`/jobs/${encodeURIComponent(id)}/allocations`);
export const metrics = (id) => api(`/jobs/${encodeURIComponent(id)}/metrics`);
export const events = (id) => api(`/jobs/${encodeURIComponent(id)}/events?limit=500`);
export const logs = (id, tail) => api(`/jobs/${encodeURIComponent(id)}/logs?tail=${tail}`);
export const setPriority = (id, priority) =>
  api(`/jobs/${encodeURIComponent(id)}/priority`, { method: "PUT", json: { priority } });
export const scaleOut = (id, count) =>
  api(`/jobs/${encodeURIComponent(id)}/scale-out`, { method: "POST", json: { count } });
export const scaleIn = (id, count) =>
  api(`/jobs/${encodeURIComponent(id)}/scale-in`, { method: "POST", json: { count } });
/** Drain `host`; with `deadline` (seconds), a job that cannot move off checkpoints first. */
export const drain = (host, deadline) =>
  api(`/cluster/hosts/${encodeURIComponent(host)}/drain`,
    { method: "POST", json: deadline === undefined ? {} : { deadline } });
export const undrain = (host) =>
  api(`/cluster/hosts/${encodeURIComponent(host)}/undrain`, { method: "POST" });
export const cancel = (id) => api(`/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" });
export const stopWorkers = (id, workers) =>
  api(`/jobs/${encodeURIComponent(id)}/workers/stop`, { method: "POST", json: { workers } });
export const cluster = () => api("/cluster");
export const utilisation = () => api("/cluster/utilisation");
export const validate = (yaml) => api("/jobs/validate", { method: "POST", yaml });
export const submit = (yaml) => api("/jobs", { method: "POST", yaml });
