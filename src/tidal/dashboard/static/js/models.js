// Models: the registered models (`#/models`), and one model (`#/models/<name>`) with its
// parameters as a form generated from their types and ranges, checked as you type (each
// error beside its field), a Train button (POST /models/<name>/train: the server's
// refusals are shown beside the fields they name too) and the model's versions.
import { api } from "./api.js";
import { clock, fill, h, jobLink } from "./dom.js";

const enc = encodeURIComponent;

export function render(view, name) {
  return name === undefined ? renderList(view) : renderModel(view, name);
}

function renderList(view) {
  const body = h("tbody");
  view.append(
    h("div", { class: "page-head" }, h("h1", {}, "Models")),
    h("section", { class: "card flush" },
      h("table", { id: "models-table" },
        h("thead", {}, h("tr", {}, ["Name", "Framework", "Dataset", "Latest version", "Aliases"]
          .map((t) => h("th", {}, t)))),
        body)),
    h("p", { class: "muted small" }, "Register one with `tidal model register` (docs/registry.md)."),
  );
  api("/models").then((models) => fill(body, models.length
    ? models.map((m) => h("tr", { dataset: { model: m.name } },
      h("td", {}, h("a", { href: `#/models/${enc(m.name)}` }, m.name)),
      h("td", {}, m.framework), h("td", {}, m.dataset ?? "–"),
      h("td", {}, m.latest_version ?? "–"),
      h("td", {}, Object.entries(m.aliases).map(([a, v]) => `${a} → ${v}`).join(", ") || "–")))
    : h("tr", {}, h("td", { colspan: 5, class: "muted" }, "No models registered."))))
    .catch((e) => fill(body, h("tr", {}, h("td", { class: "error" }, e.message))));
}

/** The problem with a parameter's typed text, or null: what the server checks too. */
export function paramProblem(param, text) {
  if (param.type === "bool") return null; // a checkbox: always true or false
  if (param.type === "str") {
    return param.choices && !param.choices.includes(text)
      ? `expected one of ${param.choices.join(", ")}` : null;
  }
  const trimmed = text.trim();
  const number = Number(trimmed);
  if (trimmed === "" || !Number.isFinite(number)) {
    return param.type === "int" ? "expected an integer" : "expected a number";
  }
  if (param.type === "int" && !Number.isInteger(number)) return "expected an integer";
  if (param.min !== null && number < param.min) return `must be ≥ ${param.min}`;
  if (param.max !== null && number > param.max) return `must be ≤ ${param.max}`;
  return null;
}

function input(param) {
  const id = `param-${param.name}`;
  if (param.type === "bool") {
    return h("input", { type: "checkbox", id, name: param.name, checked: param.default === true });
  }
  if (param.choices) {
    return h("select", { id, name: param.name },
      param.choices.map((c) => h("option", { value: c, selected: c === param.default }, c)));
  }
  const numeric = param.type === "int" || param.type === "float";
  return h("input", {
    type: "text", id, name: param.name, value: String(param.default),
    inputmode: numeric ? (param.type === "int" ? "numeric" : "decimal") : null,
  });
}

function range(param) {
  if (param.choices) return param.choices.join(" | ");
  if (param.min === null && param.max === null) return param.type;
  return `${param.type} in [${param.min ?? "−∞"}, ${param.max ?? "∞"}]`;
}

function renderModel(view, name) {
  const head = h("div", { class: "page-head" }, h("h1", {}, name));
  const facts = h("p", { class: "muted", id: "model-facts" });
  const form = h("form", { id: "train-form", class: "param-form", novalidate: true });
  const status = h("p", { id: "train-status", role: "status" });
  const versions = h("tbody");
  view.append(
    h("p", { class: "crumbs" }, h("a", { href: "#/models" }, "Models"), " / ", name),
    head, facts,
    h("div", { class: "row" },
      h("section", { class: "card half" }, h("h2", {}, "Train"), form, status),
      h("section", { class: "card half" }, h("h2", {}, "Versions"),
        h("table", { id: "versions-table" },
          h("thead", {}, h("tr", {}, ["Version", "Job", "Dataset", "Metrics", "Created"]
            .map((t) => h("th", {}, t)))),
          versions))),
  );

  // One row per field: label, control, its error (data-field names the request's field).
  const errors = new Map();
  function row(label, control, field, hint) {
    const error = h("span", { class: "field-error", dataset: { field }, role: "alert" });
    errors.set(field, error);
    return h("div", { class: "field" },
      h("label", { for: control.id }, label), control,
      h("span", { class: "muted small" }, hint || ""), error);
  }
  function showErrors(problems) {
    for (const el of errors.values()) el.textContent = "";
    for (const [field, msg] of problems) {
      const el = errors.get(field) || errors.get("form");
      el.textContent = el.textContent ? `${el.textContent}; ${msg}` : msg;
    }
  }

  let model = null;
  const controls = new Map();
  function values() {
    const params = {};
    const problems = [];
    for (const param of model.params) {
      const control = controls.get(param.name);
      if (param.type === "bool") {
        params[param.name] = control.checked;
        continue;
      }
      const problem = paramProblem(param, control.value);
      if (problem) problems.push([`params.${param.name}`, problem]);
      params[param.name] = param.type === "str" ? control.value : Number(control.value);
    }
    return { params, problems };
  }
  function check() {
    const { problems } = values();
    showErrors(problems);
    return problems.length === 0;
  }

  api(`/models/${enc(name)}`).then((m) => {
    model = m;
    fill(facts, `${m.framework} · ${m.code}/${m.entry_point} · dataset ${m.dataset ?? "none"}`,
      m.description ? ` · ${m.description}` : "");
    const rows = m.params.map((param) => {
      const control = input(param);
      controls.set(param.name, control);
      control.addEventListener("input", check);
      control.addEventListener("change", check);
      return row(param.name, control, `params.${param.name}`, `${range(param)}${param.help ? ` — ${param.help}` : ""}`);
    });
    const dataset = h("input", { type: "text", id: "train-dataset", value: m.dataset ?? "", placeholder: "NAME or NAME:VERSION" });
    const workers = h("input", { type: "text", id: "train-workers", value: "1", placeholder: "N or MIN:MAX" });
    const button = h("button", { id: "train-submit", class: "primary", type: "submit" }, "Train");
    const formError = h("p", { class: "field-error", dataset: { field: "form" } });
    errors.set("form", formError);
    fill(form, rows, row("dataset", dataset, "dataset"), row("workers", workers, "workers"),
      h("div", { class: "submit-row" }, button), formError);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      status.className = "";
      if (!check()) {
        status.className = "error";
        status.textContent = "Fix the fields marked in red.";
        return;
      }
      status.textContent = "Submitting…";
      const body = { params: values().params, workers: workers.value.trim() || "1" };
      if (dataset.value.trim()) body.dataset = dataset.value.trim();
      try {
        const job = await api(`/models/${enc(name)}/train`, { method: "POST", json: body });
        location.hash = `#/jobs/${enc(job.id)}`;
      } catch (e) {
        status.className = "error";
        if (Array.isArray(e.detail)) {
          showErrors(e.detail.map((p) => [p.path ?? (p.loc || []).slice(1).join("."), p.msg]));
          status.textContent = "Refused: see the fields marked in red.";
        } else {
          status.textContent = `Refused: ${e.message}`;
        }
      }
    });
  }).catch((e) => fill(facts, h("span", { class: "error" }, e.message)));

  api(`/models/${enc(name)}/versions`).then((list) => fill(versions, list.length
    ? list.map((v) => h("tr", { dataset: { version: v.version } },
      h("td", {}, [v.version, ...v.aliases.map((a) => ` (${a})`)]),
      h("td", {}, v.job_id ? jobLink(v.job_id) : "–"),
      h("td", {}, v.dataset ?? "–"),
      h("td", {}, Object.entries(v.metrics).map(([k, x]) => `${k} ${x.toPrecision(4)}`).join(", ") || "–"),
      h("td", { class: "time" }, clock(v.created_at))))
    : h("tr", {}, h("td", { colspan: 5, class: "muted" }, "No versions yet: train it."))))
    .catch(() => {});
  return null;
}
