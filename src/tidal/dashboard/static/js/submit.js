// Submit: paste or upload a YAML spec. It is checked as you type (POST /jobs/validate) and
// each problem is shown under the line it names; Submit sends it (POST /jobs).
import * as api from "./api.js";
import { fill, h } from "./dom.js";

const EXAMPLE = `name: my-job
command: python train.py --epochs 10
workers: {min: 1, max: 4}
priority: 5000
# working_dir: /path/to/project   # where the command runs on the server
# env: {SEED: "1"}
# labels: {team: vision}
`;

// Kept while the app is open, so a half-written spec survives a look at the jobs page.
let draft = EXAMPLE;

export function render(view) {
  const editor = h("textarea", { id: "spec-text", spellcheck: "false", rows: 16, "aria-label": "Job spec (YAML)" });
  editor.value = draft;
  const file = h("input", { type: "file", id: "spec-file", accept: ".yaml,.yml,.json,text/yaml" });
  const submitButton = h("button", { id: "spec-submit", class: "primary" }, "Submit");
  const status = h("p", { id: "spec-status", role: "status" });
  const problems = h("ul", { class: "problems", id: "spec-problems" });
  const annotated = h("div", { class: "annotated", id: "spec-annotated" });

  view.append(
    h("div", { class: "page-head" }, h("h1", {}, "Submit a job")),
    h("div", { class: "row" },
      h("section", { class: "card half" },
        h("div", { class: "logs-head" }, h("h2", {}, "Spec (YAML)"),
          h("label", { class: "button" }, "Upload…", file)),
        editor,
        h("div", { class: "submit-row" }, submitButton, status)),
      h("section", { class: "card half" },
        h("h2", {}, "Check"),
        problems,
        annotated)),
    h("p", { class: "muted small" }, "Fields: name, command, working_dir, env, workers {min, max, initial}, ",
      "resources {gpus, cpus, memory}, priority, target {group, labels}, restart {max_restarts}, ",
      "checkpoint_dir, checkpoint_every_seconds, checkpoint_every_steps, labels. See docs/controller.md."),
  );

  function showCheck(check) {
    // In reading order: problems of the spec as a whole first, then by line.
    check.problems.sort((a, b) => (a.line ?? 0) - (b.line ?? 0));
    const byLine = new Map();
    const loose = [];
    for (const p of check.problems) {
      if (p.line) byLine.set(p.line, [...(byLine.get(p.line) || []), p]);
      else loose.push(p);
    }
    fill(problems, check.valid
      ? h("li", { class: "ok" }, "Valid: ready to submit.")
      : check.problems.map((p) => h("li", { class: "problem", dataset: { path: p.path } },
        h("span", { class: "path" }, p.path || "spec"), ": ", p.msg,
        p.line ? h("span", { class: "muted" }, ` (line ${p.line})`) : null)));
    // The text with each problem right under the line it names.
    const lines = editor.value.replace(/\n$/, "").split("\n");
    fill(annotated,
      loose.map((p) => h("div", { class: "note", dataset: { path: p.path } },
        h("span", { class: "path" }, p.path || "spec"), `: ${p.msg}`)),
      lines.map((text, i) => [
        h("div", { class: byLine.has(i + 1) ? "line bad" : "line" },
          h("span", { class: "lineno" }, i + 1), h("span", { class: "code" }, text || " ")),
        (byLine.get(i + 1) || []).map((p) => h("div", { class: "note", dataset: { path: p.path, line: i + 1 } },
          h("span", { class: "path" }, p.path || "spec"), `: ${p.msg}`)),
      ]));
  }

  let timer = null;
  let seq = 0;
  async function check() {
    const mine = ++seq; // an older answer arriving late must not overwrite a newer one
    try {
      const result = await api.validate(editor.value);
      if (mine === seq) showCheck(result);
      return result;
    } catch (e) {
      if (mine === seq) fill(problems, h("li", { class: "problem" }, e.message));
      return null;
    }
  }
  editor.addEventListener("input", () => {
    draft = editor.value;
    status.textContent = "";
    clearTimeout(timer);
    timer = setTimeout(check, 300);
  });
  file.addEventListener("change", async () => {
    if (!file.files.length) return;
    editor.value = draft = await file.files[0].text();
    file.value = "";
    check();
  });
  submitButton.addEventListener("click", async () => {
    status.className = "";
    status.textContent = "Submitting…";
    try {
      const job = await api.submit(editor.value);
      draft = EXAMPLE;
      location.hash = `#/jobs/${encodeURIComponent(job.id)}`;
    } catch (e) {
      status.className = "error";
      const n = Array.isArray(e.detail) ? e.detail.length : 0;
      status.textContent = n
        ? `Refused: ${n} problem(s), each shown under its line.`
        : `Refused: ${e.message}`;
      check();
    }
  });
  check();
  return () => clearTimeout(timer);
}
