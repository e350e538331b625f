// Every call the pages make to the REST API. The browser sends the login cookie; the
// extra header tells the server the request comes from this app (it refuses cookie-
// authenticated changes without it, so other sites cannot forge them).

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

/** Every job (summary view), page by page. The server answers each page with an ETag and
 *  `Cache-Control: no-cache`, so the browser revalidates with If-None-Match on each poll
 *  and an unchanged page comes back as a body-less 304 (served here from its cache). */
export async function jobs() {
  const all = [];
  let after = null;
  for (;;) {
    const query = `/jobs?limit=1000${after ? `&after=${encodeURIComponent(after)}` : ""}`;
    const response = await request(query);
    if (response.status === 401) {
      location.href = "/login";
      throw new ApiError(401, "not logged in");
    }
    if (!response.ok) throw new ApiError(response.status, response.statusText);
    all.push(...(await response.json()));
    after = response.headers.get("X-Next-Cursor");
    if (!after) return all;
  }
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
export const cancel = (id) => api(`/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" });
export const cluster = () => api("/cluster");
export const utilisation = () => api("/cluster/utilisation");
export const validate = (yaml) => api("/jobs/validate", { method: "POST", yaml });
export const submit = (yaml) => api("/jobs", { method: "POST", yaml });
