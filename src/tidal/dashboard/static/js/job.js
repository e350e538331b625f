// One job: its allocation over time, training metrics, workers, events and logs, and the
// actions (priority, scale out/in, cancel, stop one worker). Everything but the logs is polled every POLL_MS;
// logs are loaded once, or streamed while "follow" is ticked.
import * as api from "./api.js";
import { Chart, stepColumns } from "./charts.js";
import {
  badge, clock, duration, fill, h, jobColour, labelChips, timeCell, workerCounts,
} from "./dom.js";
import { every, POLL_MS } from "./poll.js";

const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
// Workers that hold a slot: the ones a stop applies to.
const LIVE_WORKERS = new Set(["starting", "running"]);
// What the workers table can show: the live ones (the default), all, or one state.
const WORKER_STATES = ["starting", "running", "released", "exited", "failed"];
const BAD_EVENTS = new Set(["failed", "restart", "worker_failed", "lost", "backend_error", "policy_error"]);
const RESCALE_EVENTS = new Set(["rescale", "rescaled", "rescaling", "scale", "scale_out", "scale_in", "preempted", "started"]);
// Charted first when reported; any other metric follows in name order.
const METRIC_ORDER = ["loss", "accuracy", "samples/s", "samples_per_s", "throughput"];
const LOG_TAIL = 200;
const LOG_KEEP = 2000;

// A worker given several GPUs holds several slots of its host: "2,3".
function slotsOf(worker) {
  return (worker.slots && worker.slots.length ? worker.slots : [worker.slot]).join(",");
}

// "cmd args" of a command stored as argv or as one string.
function commandText(command) {
  return Array.isArray(command) ? command.join(" ") : String(command ?? "");
}

// The command of each role, named by the role (and its launcher) when the job has several.
function commands(spec) {
  const roles = spec.roles || [];
  if (!roles.length) return h("code", { class: "small" }, commandText(spec.command));
  return roles.map((r) => h("div", { class: "role-command", dataset: { role: r.name } },
    h("span", { class: "muted small" }, `${r.name} (${r.launcher || "tidal"}): `),
    h("code", { class: "small" }, commandText(r.command))));
}

// The slots a finished job held last: its allocation just before it gave them back.
function endedWith(allocs) {
  for (let i = allocs.length - 1; i >= 0; i -= 1) if (allocs[i].count > 0) return allocs[i].count;
  return 0;
}

function fact(label, ...value) {
  return h("div", { class: label === "Command" ? "fact wide" : "fact" }, h("div", { class: "fact-label" }, label), h("div", { class: "fact-value" }, ...value));
}

// A modal that asks first: its "no" button keeps things as they are, "yes" runs onYes.
// Ids: NAME-dialog, NAME-no, NAME-yes.
function confirmation(name, title, text, keep, go, onYes) {
  const dialog = h("dialog", { id: `${name}-dialog` }, h("h2", {}, title), text,
    h("div", { class: "dialog-buttons" },
      h("button", { id: `${name}-no`, value: "no" }, keep),
      h("button", { id: `${name}-yes`, class: "danger", value: "yes" }, go)));
  dialog.addEventListener("click", (e) => {
    if (e.target.value === "no") dialog.close();
    if (e.target.value === "yes") {
      dialog.close();
      onYes();
    }
  });
  return dialog;
}

/** Why `me` may not change `job` (null: they may), as the server's access rules say:
 * admins change every job, members their team's, viewers none. Until the page knows who is
 * looking it offers the actions (the server refuses what it must). */
function changeRefusal(me, job) {
  if (!me || me.role === "admin") return null;
  if (me.role === "viewer") return "Viewers change no job.";
  if (me.team !== job.team) return `This job is team ${job.team}'s: you change only team ${me.team}'s jobs.`;
  return null;
}

function metricNames(points) {
  const names = new Set(points.flatMap((p) => Object.keys(p.values)));
  const known = METRIC_ORDER.filter((n) => names.has(n));
  return [...known, ...[...names].filter((n) => !known.includes(n)).sort()];
}

export function render(view, id) {
  const el = {
    title: h("h1", {}, id),
    state: h("span"),
    id: h("span", { class: "muted" }),
    reason: h("p", { class: "reason-line", id: "job-reason" }),
    facts: h("div", { class: "facts" }),
    message: h("p", { class: "action-msg", id: "action-msg", role: "status" }),
    priority: h("input", { id: "priority-input", type: "number", min: 1, max: 1000000, step: 1 }),
    count: h("input", { id: "scale-count", type: "number", min: 1, value: 1, step: 1 }),
    alloc: h("div", { class: "chart", id: "alloc-chart" }),
    metrics: h("div", { class: "metric-charts", id: "metric-charts" }),
    workers: h("tbody"),
    events: h("tbody"),
    logs: h("pre", { class: "logs", id: "logs" }),
    follow: h("input", { type: "checkbox", id: "logs-follow" }),
    workerFilter: h("select", { id: "workers-filter", "aria-label": "Workers shown" },
      h("option", { value: "live", selected: true }, "live (starting, running)"),
      h("option", { value: "all" }, "all, ended too"),
      WORKER_STATES.map((s) => h("option", { value: s }, s))),
    workersHidden: h("p", { class: "muted small", id: "workers-hidden" }),
    refused: h("p", { class: "muted small", id: "actions-refused" }),
  };
  const swatch = h("span", { class: "swatch big", style: `background:${jobColour(id)}` });
  const buttons = {
    priority: h("button", { id: "priority-set" }, "Set priority"),
    out: h("button", { id: "scale-out" }, "Scale out"),
    in: h("button", { id: "scale-in" }, "Scale in"),
    cancel: h("button", { id: "cancel-job", class: "danger" }, "Cancel job…"),
  };
  const dialog = confirmation("cancel", "Cancel this job?",
    h("p", {}, `Every worker of ${id} stops; the job ends as cancelled and cannot be resumed.`),
    "Keep it running", "Cancel job", () => act("Cancel", () => api.cancel(id)));
  // Which worker the stop dialog is about (the table is redrawn at every poll).
  let stopping = null;
  const stopText = h("p", { id: "stop-worker-text" });
  const stopDialog = confirmation("stop-worker", "Stop this worker?", stopText, "Keep it", "Stop worker",
    () => {
      const worker = stopping;
      act(`Stop worker ${worker}`, () => api.stopWorkers(id, [worker]));
    });

  const controls = h("div", { id: "job-controls" },
    h("div", { class: "action" }, h("label", { for: "priority-input" }, "Priority"), el.priority, buttons.priority),
    h("div", { class: "action" }, h("label", { for: "scale-count" }, "Workers"), el.count, buttons.out, buttons.in),
    h("div", { class: "action" }, buttons.cancel));

  view.append(
    h("p", { class: "crumbs" }, h("a", { href: "#/jobs" }, "Jobs"), " / ", id),
    h("div", { class: "page-head" }, swatch, el.title, el.state, el.id),
    el.reason,
    h("div", { class: "row" },
      h("section", { class: "card grow" }, el.facts),
      h("section", { class: "card actions" },
        h("h2", {}, "Actions"),
        controls,
        el.refused,
        el.message)),
    h("div", { class: "row" },
      h("section", { class: "card half" },
        h("h2", {}, "Allocation", h("span", { class: "muted small" }, " — slots held over time")), el.alloc),
      h("section", { class: "card half" },
        h("h2", {}, "Training metrics", h("span", { class: "muted small" }, " — by step")), el.metrics)),
    h("div", { class: "row" },
      h("section", { class: "card half" },
        h("div", { class: "card-head" }, h("h2", {}, "Workers"),
          h("label", { class: "muted small" }, "Show ", el.workerFilter)),
        h("table", { id: "workers-table" },
          h("thead", {}, h("tr", {}, ["Worker", "Role", "Host", "Slot", "PID", "State", "Exit", ""].map((t) => h("th", {}, t)))),
          el.workers), el.workersHidden),
      h("section", { class: "card half" }, h("h2", {}, "Events"),
        h("div", { class: "scroll" }, h("table", { id: "events-table" },
          h("thead", {}, h("tr", {}, ["Time", "Event", "", "Stall"].map((t) => h("th", {}, t)))),
          el.events)))),
    h("section", { class: "card" },
      h("div", { class: "logs-head" }, h("h2", {}, "Logs"),
        h("label", {}, el.follow, " follow"),
        h("button", { id: "logs-reload", onclick: () => loadLogs() }, "Reload")),
      el.logs),
    dialog,
    stopDialog,
  );

  const allocChart = new Chart(el.alloc, [{ label: "slots", colour: jobColour(id), stepped: true, fill: true }], {
    integer: true, yLabel: "slots",
  });
  const metricCharts = new Map();
  let current = null;
  let lastAllocs = [];
  let priorityTouched = false;
  el.priority.addEventListener("input", () => { priorityTouched = true; });
  // Who is looking: the actions are offered only to those the server lets change the job.
  let me = null;
  api.api("/me").then((who) => {
    me = who;
    if (current) drawJob(current, lastAllocs);
  }).catch(() => {});

  const say = (text, bad = false) => {
    el.message.textContent = text;
    el.message.classList.toggle("error", bad);
  };
  const act = async (what, call) => {
    try {
      say(`${what}…`);
      await call();
      say(`${what}: done; the controller applies it on its next tick.`);
      await refresh();
    } catch (e) {
      say(`${what} refused: ${e.message}`, true);
    }
  };
  buttons.priority.addEventListener("click", () => act("Priority", async () => {
    await api.setPriority(id, Number(el.priority.value));
    priorityTouched = false;
  }));
  buttons.out.addEventListener("click", () => act("Scale out", () => api.scaleOut(id, Number(el.count.value))));
  buttons.in.addEventListener("click", () => act("Scale in", () => api.scaleIn(id, Number(el.count.value))));
  buttons.cancel.addEventListener("click", () => dialog.showModal());

  function askToStop(worker) {
    stopping = worker.worker_id;
    stopText.textContent = `Worker ${worker.worker_id} (${worker.role}, ${worker.host} slot ${slotsOf(worker)}) `
      + `stops for good and ${id} goes on without it: the job gives up that slot and runs one `
      + "worker fewer (an elastic job is scaled in by one). The server refuses when the others "
      + "count on it (a parameter server, a chief) or it is the last one.";
    stopDialog.showModal();
  }

  function shownWorker(worker) {
    const filter = el.workerFilter.value;
    if (filter === "all") return true;
    if (filter === "live") return LIVE_WORKERS.has(worker.state);
    return worker.state === filter;
  }

  function drawJob(job, allocs) {
    // A finished job has no live worker: it lists all of them unless told otherwise.
    if (!current && TERMINAL.has(job.state)) el.workerFilter.value = "all";
    current = job;
    lastAllocs = allocs;
    el.title.textContent = job.name;
    fill(el.state, badge(job.state));
    el.id.textContent = job.id;
    el.reason.textContent = job.cancel_requested && !TERMINAL.has(job.state)
      ? `cancelling… ${job.reason}` : job.reason;
    const ran = job.started_at ? (job.finished_at ?? Date.now() / 1000) - job.started_at : null;
    // Workers as users count them; the slots they hold only where a worker holds several.
    const counts = workerCounts(job);
    const over = TERMINAL.has(job.state);
    // A finished job holds nothing and has no target any more: it shows what it ended with.
    const slots = over ? endedWith(allocs) : job.workers;
    const size = over ? Math.floor(slots / counts.slots_per_worker) : counts.now;
    fill(el.facts,
      fact("Workers", h("span", { id: "workers-now", class: "big-num" }, size),
        h("span", { class: "muted" }, ` ${over ? "at the end" : "now"} · min ${counts.min} · max ${counts.max}`),
        !over && counts.target !== null ? h("div", { class: "muted small", id: "workers-target" }, `target ${counts.target}`) : null,
        counts.slots_per_worker > 1
          ? h("div", { class: "muted small" },
            `${slots} slots ${over ? "held last" : "held"} · ${counts.slots_per_worker} per worker`) : null),
      fact("Priority", h("span", { id: "priority-now", class: "big-num" }, job.priority)),
      fact("Reallocations", job.reallocations, h("div", { class: "muted small" }, `${job.restarts} restart(s)`)),
      fact("Submitted", clock(job.submitted_at)),
      fact("Started", clock(job.started_at), ran !== null ? h("div", { class: "muted small" }, `ran ${duration(ran)}`) : null),
      fact("Ended", clock(job.finished_at)),
      fact("Labels", h("span", { id: "job-labels" }, labelChips(job.labels) ?? h("span", { class: "muted" }, "none"))),
      fact("Command", h("div", { id: "job-command" }, commands(job.spec))),
    );
    if (!priorityTouched) el.priority.value = job.priority;
    const refusal = changeRefusal(me, job);
    controls.hidden = refusal !== null;
    el.refused.textContent = refusal ?? "";
    for (const b of Object.values(buttons)) b.disabled = over;
    el.priority.disabled = over;
    el.count.disabled = over;
    const shown = job.worker_list.filter(shownWorker);
    const hidden = job.worker_list.length - shown.length;
    el.workersHidden.textContent = hidden ? `${hidden} more not shown (Show: all)` : "";
    fill(el.workers, shown.map((w) => h("tr", { dataset: { worker: w.worker_id, state: w.state } },
      h("td", { class: "num" }, w.worker_id), h("td", {}, w.role), h("td", {}, w.host),
      h("td", { class: "num" }, slotsOf(w)), h("td", { class: "num muted" }, w.pid ?? "–"),
      h("td", {}, badge(w.state)), h("td", { class: "num" }, w.exit_code ?? ""),
      h("td", {}, !over && refusal === null && LIVE_WORKERS.has(w.state)
        ? h("button", { class: "danger small stop-worker", title: `Stop worker ${w.worker_id}`, onclick: () => askToStop(w) }, "Stop…")
        : null))));
  }

  function drawAllocation(points, job) {
    const until = TERMINAL.has(job.state) ? job.finished_at : Date.now() / 1000;
    allocChart.setData(stepColumns(points.map((a) => ({ time: a.time, value: a.count })), until));
  }

  function drawMetrics(points) {
    const names = metricNames(points);
    if (!names.length) {
      fill(el.metrics, h("p", { class: "empty" }, "No metrics reported yet."));
      return;
    }
    if (!metricCharts.size) el.metrics.replaceChildren();
    for (const name of names) {
      let chart = metricCharts.get(name);
      if (!chart) {
        const box = h("div", { class: "chart small-chart", dataset: { metric: name } });
        el.metrics.append(h("div", { class: "metric" }, h("div", { class: "metric-name" }, name), box));
        chart = new Chart(box, [{ label: name, colour: jobColour(id) }], { time: false, height: 150, legend: false });
        metricCharts.set(name, chart);
      }
      const rows = points.filter((p) => name in p.values);
      chart.setData([rows.map((p) => p.step), rows.map((p) => p.values[name])]);
    }
  }

  function drawEvents(list) {
    fill(el.events, list.slice().reverse().map((e) => {
      const kind = BAD_EVENTS.has(e.kind) ? "bad" : RESCALE_EVENTS.has(e.kind) ? "rescale" : "";
      const stall = e.data && typeof e.data.stall_s === "number" ? `${e.data.stall_s.toFixed(2)} s` : "";
      return h("tr", { class: `event ${kind}`, dataset: { kind: e.kind } },
        timeCell(e.time), h("td", {}, h("span", { class: "event-kind" }, e.kind)),
        h("td", { class: "message" }, e.message, e.actor ? h("span", { class: "muted actor" }, ` · ${e.actor} (${e.source || "?"})`) : ""),
        h("td", { class: "num" }, stall));
    }));
  }

  async function refresh() {
    // Metrics are for the job's team and admins: a refusal there leaves the rest shown.
    const [job, allocs, mets, evs] = await Promise.all([
      api.job(id), api.allocations(id), api.metrics(id).catch((e) => e), api.events(id),
    ]);
    drawJob(job, allocs);
    drawAllocation(allocs, job);
    if (mets instanceof Error) fill(el.metrics, h("p", { class: "empty", id: "metrics-refused" }, mets.message));
    else drawMetrics(mets);
    drawEvents(evs);
  }

  // Logs: a snapshot, or a stream while following.
  let streaming = null;
  function keepTail(text) {
    const lines = text.split("\n");
    return lines.length > LOG_KEEP ? lines.slice(-LOG_KEEP).join("\n") : text;
  }
  function showLogs(text) {
    const atBottom = el.logs.scrollTop + el.logs.clientHeight >= el.logs.scrollHeight - 20;
    el.logs.textContent = keepTail(text) || "(no output yet)";
    if (atBottom || el.follow.checked) el.logs.scrollTop = el.logs.scrollHeight;
  }
  async function loadLogs() {
    try {
      showLogs(await api.logs(id, LOG_TAIL));
    } catch (e) {
      showLogs(`cannot read the logs: ${e.message}`);
    }
  }
  function follow(on) {
    if (streaming) streaming.abort();
    streaming = null;
    if (!on) return;
    const controller = new AbortController();
    streaming = controller;
    let text = "";
    api.stream(`/jobs/${encodeURIComponent(id)}/logs?tail=${LOG_TAIL}&follow=true`, (chunk) => {
      text = keepTail(text + chunk);
      showLogs(text);
    }, controller.signal)
      .then(() => { if (streaming === controller) el.follow.checked = false; })
      .catch((e) => { if (e.name !== "AbortError") showLogs(`${text}\n(stream ended: ${e.message})`); });
  }
  el.workerFilter.addEventListener("change", () => { if (current) drawJob(current, lastAllocs); });
  el.follow.addEventListener("change", () => (el.follow.checked ? follow(true) : loadLogs()));

  let logsStarted = false;
  const stopPolling = every(POLL_MS, async () => {
    await refresh();
    if (!logsStarted) {
      // Follow a live job's logs by default; a finished job's are shown once.
      logsStarted = true;
      if (!TERMINAL.has(current.state)) {
        el.follow.checked = true;
        follow(true);
      } else {
        loadLogs();
      }
    }
  });

  return () => {
    stopPolling();
    follow(false);
    allocChart.destroy();
    for (const c of metricCharts.values()) c.destroy();
  };
}
