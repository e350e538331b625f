// Cluster: every host's slots coloured by the job holding them, utilisation over time,
// every job's slots over time (usage.js), and with team queues each team's (teams.js).
import * as api from "./api.js";
import { Chart, stepColumns } from "./charts.js";
import { fill, h, jobColour, jobLink } from "./dom.js";
import { every, POLL_MS } from "./poll.js";
import { teamCard } from "./teams.js";
import { usage, usageCard } from "./usage.js";

/** How far back the usage chart looks, in seconds. */
const USAGE_WINDOW_S = 3600;

// While a host drains: who asked, when it goes, which jobs are still on it.
function drainText(host) {
  const d = host.draining;
  const goes = d.leaves_at ? `, goes in ${Math.max(0, Math.round(d.leaves_at - Date.now() / 1000))}s` : "";
  const still = d.remaining.length ? `still on it: ${d.remaining.join(", ")}` : "drained";
  return `draining (${d.source}${goes}) · ${still}`;
}

/** Ask whether to drain `name` and for a deadline: {deadline} (undefined: none), null when
 *  dismissed; throws on an answer that is not a number of seconds. */
function askDrain(name) {
  const answer = prompt(`Drain ${name}? Its jobs move off at their next step boundary.\n`
    + "Deadline in seconds (a job that cannot move checkpoints before it), empty for none:", "");
  if (answer === null) return null;
  const text = answer.trim();
  if (!text) return { deadline: undefined };
  const deadline = Number(text);
  if (!Number.isFinite(deadline) || deadline <= 0) {
    throw new Error(`deadline: expected a number of seconds > 0, got '${text}'`);
  }
  return { deadline };
}

// One host's row: its name, kind, drain state and button, and its slots. Kept while what
// it shows is unchanged (rebuilding it every poll would drop a click made meanwhile).
// Drain and Undrain are for admins (the server refuses anyone else): others get no button.
function hostRow(host, names, act, admin) {
  const drain = host.draining ? h("div", { class: "small draining" }, drainText(host)) : null;
  const row = h("div", { class: "host-row", dataset: { host: host.name } },
    h("div", { class: "host-name" }, host.name,
      h("div", { class: "muted small" }, [host.gpu ? "GPU" : "CPU", host.group].filter(Boolean).join(" · ")),
      drain,
      admin && h("button", {
        class: "small drain", dataset: { host: host.name },
        title: host.draining ? "Put the host back in service" : "Move every job off this host at its next step boundary",
        onclick: () => act(host),
      }, host.draining ? "Undrain" : "Drain")),
    h("div", { class: "slots" }, host.used_by.map((job, i) => job
      ? h("a", {
        class: "slot used", href: `#/jobs/${encodeURIComponent(job)}`, title: `${host.name}:${i} — ${job}`,
        style: `background:${jobColour(job)}`, dataset: { job, slot: i },
      }, h("span", { class: "slot-index" }, i), h("span", { class: "slot-job" }, names.get(job) ?? job))
      : h("div", { class: "slot free", title: `${host.name}:${i} — free`, dataset: { slot: i } },
        h("span", { class: "slot-index" }, i), h("span", { class: "slot-job" }, "free")))));
  return { row, drain };
}

export function render(view) {
  const summary = h("span", { class: "muted", id: "cluster-summary" });
  const grid = h("div", { class: "slot-grid", id: "slot-grid" });
  const message = h("div", { class: "small error", id: "cluster-message", role: "status" });
  const legend = h("div", { class: "legend", id: "slot-legend" });
  const chartBox = h("div", { class: "chart", id: "util-chart" });
  view.append(
    h("div", { class: "page-head" }, h("h1", {}, "Cluster"), summary),
    h("section", { class: "card" }, h("h2", {}, "Slots", h("span", { class: "muted small" }, " — hosts × slots, coloured by the job holding each")), message, grid, legend),
    h("section", { class: "card" }, h("h2", {}, "Utilisation", h("span", { class: "muted small" }, " — slots in use over time")), chartBox),
  );
  const chart = new Chart(chartBox, [
    { label: "used", colour: "#2563eb", stepped: true, fill: true },
    { label: "total", colour: "#94a3b8", stepped: true, dash: [6, 4] },
  ], { integer: true, yLabel: "slots" });
  const usageChart = usageCard(view);
  const teamCharts = teamCard(view);
  // Each host's row and what it was built from (its view and its jobs' names).
  let rows = new Map();
  let stopped = false;
  let admin = false;
  let refresh = () => {};
  const act = async (host) => {
    message.textContent = "";
    try {
      if (host.draining) {
        await api.undrain(host.name);
      } else {
        const asked = askDrain(host.name);
        if (asked === null) return;
        await api.drain(host.name, asked.deadline);
      }
    } catch (e) {
      message.textContent = `${host.name}: ${e.message}`;
      return;
    }
    refresh();
  };

  const tick = async () => {
    const since = Date.now() / 1000 - USAGE_WINDOW_S;
    const [cluster, util, jobs, used] = await Promise.all(
      [api.cluster(), api.utilisation(), api.jobs(), usage(since)]);
    const names = new Map(jobs.map((j) => [j.id, j.name]));
    summary.textContent = `${cluster.used_slots} of ${cluster.total_slots} slots in use · policy ${cluster.policy}`;
    const next = new Map();
    for (const host of cluster.hosts) {
      const key = JSON.stringify([admin, host.name, host.gpu, host.group, host.used_by.map((j) => j && [j, names.get(j)]),
        host.draining && [host.draining.source, host.draining.leaves_at, host.draining.remaining]]);
      const kept = rows.get(host.name);
      const built = kept && kept.key === key ? kept : { key, ...hostRow(host, names, act, admin) };
      if (built.drain) built.drain.textContent = drainText(host); // the countdown moves on
      next.set(host.name, built);
    }
    const order = [...next.values()].map((r) => r.row);
    if (order.length !== grid.children.length || order.some((r, i) => grid.children[i] !== r)) fill(grid, order);
    rows = next;
    const holders = [...new Set(cluster.hosts.flatMap((x) => x.used_by).filter(Boolean))];
    fill(legend, holders.map((job) => {
      const n = cluster.hosts.flatMap((x) => x.used_by).filter((j) => j === job).length;
      return h("span", { class: "legend-item" }, h("span", { class: "swatch", style: `background:${jobColour(job)}` }),
        jobLink(job, names.get(job) ?? job), h("span", { class: "muted" }, ` ${n} slot(s)`));
    }));
    const now = Date.now() / 1000;
    const [xs, usedNow] = stepColumns(util.map((p) => ({ time: p.time, value: p.used })), now);
    chart.setData([xs, usedNow, xs.map(() => cluster.total_slots)]);
    usageChart.update(used, names);
    teamCharts.update(used);
  };
  const stop = every(POLL_MS, tick);
  // After a drain or undrain, show it at once rather than at the next poll.
  refresh = () => stopped || tick().catch(() => {});
  api.api("/me").then((me) => {
    admin = me.role === "admin";
    refresh();
  }).catch(() => {});
  return () => {
    stopped = true;
    stop();
    chart.destroy();
    usageChart.destroy();
    teamCharts.destroy();
  };
}
