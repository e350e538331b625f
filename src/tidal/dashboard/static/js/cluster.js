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
function drainState(host) {
  const d = host.draining;
  if (!d) return "";
  const goes = d.leaves_at ? `, goes in ${Math.max(0, Math.round(d.leaves_at - Date.now() / 1000))}s` : "";
  const still = d.remaining.length ? `still on it: ${d.remaining.join(", ")}` : "drained";
  return h("div", { class: "small draining" }, `draining (${d.source}${goes}) · ${still}`);
}

export function render(view) {
  const summary = h("span", { class: "muted", id: "cluster-summary" });
  const grid = h("div", { class: "slot-grid", id: "slot-grid" });
  const legend = h("div", { class: "legend", id: "slot-legend" });
  const chartBox = h("div", { class: "chart", id: "util-chart" });
  view.append(
    h("div", { class: "page-head" }, h("h1", {}, "Cluster"), summary),
    h("section", { class: "card" }, h("h2", {}, "Slots", h("span", { class: "muted small" }, " — hosts × slots, coloured by the job holding each")), grid, legend),
    h("section", { class: "card" }, h("h2", {}, "Utilisation", h("span", { class: "muted small" }, " — slots in use over time")), chartBox),
  );
  const chart = new Chart(chartBox, [
    { label: "used", colour: "#2563eb", stepped: true, fill: true },
    { label: "total", colour: "#94a3b8", stepped: true, dash: [6, 4] },
  ], { integer: true, yLabel: "slots" });
  const usageChart = usageCard(view);
  const teamCharts = teamCard(view);

  const stop = every(POLL_MS, async () => {
    const since = Date.now() / 1000 - USAGE_WINDOW_S;
    const [cluster, util, jobs, used] = await Promise.all(
      [api.cluster(), api.utilisation(), api.jobs(), usage(since)]);
    const names = new Map(jobs.map((j) => [j.id, j.name]));
    summary.textContent = `${cluster.used_slots} of ${cluster.total_slots} slots in use · policy ${cluster.policy}`;
    fill(grid, cluster.hosts.map((host) => h("div", { class: "host-row" },
      h("div", { class: "host-name" }, host.name,
        h("div", { class: "muted small" }, [host.gpu ? "GPU" : "CPU", host.group].filter(Boolean).join(" · ")),
        drainState(host),
        h("button", {
          class: "small", dataset: { host: host.name },
          title: host.draining ? "Put the host back in service" : "Move every job off this host at its next step boundary",
          onclick: () => (host.draining ? api.undrain(host.name) : api.drain(host.name)).catch((e) => alert(e.message)),
        }, host.draining ? "Undrain" : "Drain")),
      h("div", { class: "slots" }, host.used_by.map((job, i) => job
        ? h("a", {
          class: "slot used", href: `#/jobs/${encodeURIComponent(job)}`, title: `${host.name}:${i} — ${job}`,
          style: `background:${jobColour(job)}`, dataset: { job, slot: i },
        }, h("span", { class: "slot-index" }, i), h("span", { class: "slot-job" }, names.get(job) ?? job))
        : h("div", { class: "slot free", title: `${host.name}:${i} — free`, dataset: { slot: i } },
          h("span", { class: "slot-index" }, i), h("span", { class: "slot-job" }, "free")))))));
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
  });
  return () => {
    stop();
    chart.destroy();
    usageChart.destroy();
    teamCharts.destroy();
  };
}
