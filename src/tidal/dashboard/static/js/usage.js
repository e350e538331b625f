// The cluster's usage over time: every job's slots as one band of a stacked chart, the
// cluster's size as a dashed line, priority changes and rescales as vertical marks, and
// utilisation (the share of slots in use) beside it. Data: GET /cluster/usage.
//
// The chart's element keeps what it draws in data attributes, as charts.js does:
// data-bands (the job ids, bottom band first), data-points (the columns as drawn: times,
// then each band's top, top band first, then the cluster's size) and data-marks.
import { api } from "./api.js";
import { Chart } from "./charts.js";
import { fill, h, jobColour, jobLink } from "./dom.js";

const uPlot = window.uPlot;
const MARK_COLOURS = { priority: "#dc2626", rescale: "#64748b" };

/** Cumulative columns: band k's top is the sum of jobs 0..k at each time. */
export function stack(jobs) {
  const tops = [];
  let below = null;
  for (const series of jobs) {
    const top = series.slots.map((n, i) => n + (below ? below[i] : 0));
    tops.push(top);
    below = top;
  }
  return tops;
}

/** The usage card: build it in `view`; returns {update(usage, names), destroy()}. */
export function usageCard(view) {
  const box = h("div", { class: "chart", id: "usage-chart" });
  const legend = h("div", { class: "legend", id: "usage-legend" });
  const utilBox = h("div", { class: "chart", id: "usage-util-chart" });
  view.append(
    h("section", { class: "card usage" },
      h("h2", {}, "Usage", h("span", { class: "muted small" },
        " — each job's slots over time, stacked; marks: priority changes (red), rescales (grey)")),
      h("div", { class: "usage-charts" }, box, utilBox),
      legend),
  );
  const util = new Chart(utilBox, [{ label: "utilisation %", colour: "#2563eb", stepped: true, fill: true }],
    { height: 260, yLabel: "% of slots in use" });
  let plot = null;
  let bandsKey = "";
  let marks = [];

  const drawMarks = (u) => {
    const ctx = u.ctx;
    ctx.save();
    ctx.lineWidth = 1.5 * devicePixelRatio;
    for (const m of marks) {
      const x = Math.round(u.valToPos(m.time, "x", true));
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
      ctx.strokeStyle = MARK_COLOURS[m.kind] ?? "#64748b";
      ctx.setLineDash(m.kind === "priority" ? [] : [4, 3]);
      ctx.beginPath();
      ctx.moveTo(x, u.bbox.top);
      ctx.lineTo(x, u.bbox.top + u.bbox.height);
      ctx.stroke();
    }
    ctx.restore();
  };

  const build = (jobs, names) => {
    if (plot) plot.destroy();
    const stepped = uPlot.paths.stepped({ align: 1 });
    // Top band first: each band fills down to 0 and the ones below paint over it, so
    // every band shows between its top and the next one's.
    const series = [...jobs].reverse().map((s) => ({
      label: names.get(s.job_id) ?? s.job_id,
      stroke: jobColour(s.job_id),
      fill: jobColour(s.job_id),
      width: 1,
      paths: stepped,
      points: { show: false },
    }));
    plot = new uPlot({
      width: Math.max(box.clientWidth, 200),
      height: 260,
      legend: { show: true, live: true },
      cursor: { drag: { x: true, y: false } },
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(max ?? 0, 1) + 0.5] } },
      axes: [
        { stroke: "#475569", grid: { stroke: "#e2e8f0" } },
        { label: "slots", stroke: "#475569", grid: { stroke: "#e2e8f0" },
          incrs: [1, 2, 4, 5, 10, 20, 50, 100, 200, 500, 1000],
          values: (u, ticks) => ticks.map((t) => t.toFixed(0)) },
      ],
      series: [
        { label: "time" },
        ...series,
        { label: "total", stroke: "#94a3b8", dash: [6, 4], width: 2, paths: stepped, points: { show: false } },
      ],
      hooks: { draw: [drawMarks] },
    }, [[], ...series.map(() => []), []], box);
  };

  const resizer = new ResizeObserver(() => plot?.setSize({ width: Math.max(box.clientWidth, 200), height: 260 }));
  resizer.observe(box);

  return {
    update(usage, names) {
      const key = JSON.stringify(usage.jobs.map((s) => s.job_id));
      if (key !== bandsKey || !plot) {
        build(usage.jobs, names);
        bandsKey = key;
      }
      marks = usage.marks;
      const data = [usage.times, ...stack(usage.jobs).reverse(), usage.times.map(() => usage.total_slots)];
      box.dataset.bands = key;
      box.dataset.points = JSON.stringify(data);
      box.dataset.marks = JSON.stringify(marks.map((m) => [m.time, m.job_id, m.kind]));
      plot.setData(data);
      util.setData([usage.times, usage.utilisation.map((u) => Math.round(u * 1000) / 10)]);
      fill(legend, usage.jobs.map((s) => {
        const now = s.slots[s.slots.length - 1] ?? 0;
        return h("span", { class: "legend-item usage-band", dataset: { job: s.job_id } },
          h("span", { class: "swatch", style: `background:${jobColour(s.job_id)}` }),
          jobLink(s.job_id, names.get(s.job_id) ?? s.job_id),
          h("span", { class: "muted" }, ` ${now} slot(s) now`));
      }));
    },
    destroy() {
      resizer.disconnect();
      plot?.destroy();
      util.destroy();
    },
  };
}

/** The window the page shows: the last hour. */
export const usage = (since) => api(`/cluster/usage?since=${since}`);
