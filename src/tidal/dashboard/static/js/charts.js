// Charts over the vendored uPlot (a global from /ui/vendor/uplot). A chart keeps the data
// it draws in its element's data-points attribute (JSON), so tests and curious users can
// read exactly what is on screen.

const uPlot = window.uPlot;

/**
 * A line chart filling `container`'s width.
 *   series: [{label, colour, stepped, dash, fill}]   one per y column
 *   options: {height, time (x is Unix seconds), integer (slot counts), yMax, legend,
 *             xLabel, yLabel}
 * setData([xs, ys1, ys2, ...]) draws; destroy() removes it.
 */
export class Chart {
  constructor(container, series, options = {}) {
    this.container = container;
    this.options = { height: 220, time: true, integer: false, ...options };
    const stepped = uPlot.paths.stepped({ align: 1 });
    const o = this.options;
    this.plot = new uPlot(
      {
        width: Math.max(container.clientWidth, 200),
        height: o.height,
        legend: { show: o.legend !== false, live: true },
        cursor: { drag: { x: true, y: false } },
        scales: {
          x: { time: o.time },
          // Slot counts start at 0 and leave room above the top level; metrics auto-range.
          y: o.integer
            ? { range: (u, min, max) => [0, Math.max(o.yMax ?? 0, max ?? 0, 1) + 0.5] }
            : {},
        },
        axes: [
          { label: o.xLabel, stroke: "#475569", grid: { stroke: "#e2e8f0" } },
          {
            label: o.yLabel,
            stroke: "#475569",
            grid: { stroke: "#e2e8f0" },
            // Slots are whole numbers: no 2.5 workers on the axis.
            incrs: o.integer ? [1, 2, 4, 5, 10, 20, 50, 100, 200, 500, 1000] : undefined,
            values: o.integer ? (u, ticks) => ticks.map((t) => t.toFixed(0)) : undefined,
          },
        ],
        series: [
          { label: o.time ? "time" : o.xLabel || "x" },
          ...series.map((s) => ({
            label: s.label,
            stroke: s.colour,
            width: 2,
            dash: s.dash,
            fill: s.fill ? `${s.colour}22` : undefined,
            paths: s.stepped ? stepped : undefined,
            points: { show: false },
            spanGaps: true,
          })),
        ],
      },
      [[], ...series.map(() => [])],
      container,
    );
    this.resizer = new ResizeObserver(() =>
      this.plot.setSize({ width: Math.max(container.clientWidth, 200), height: o.height }),
    );
    this.resizer.observe(container);
  }

  setData(data) {
    const text = JSON.stringify(data);
    if (text === this.container.dataset.points) return; // nothing new: keep the zoom
    this.container.dataset.points = text;
    const ys = data[1] || [];
    this.container.dataset.last = ys.length ? String(ys[ys.length - 1]) : "";
    this.plot.setData(data);
  }

  destroy() {
    this.resizer.disconnect();
    this.plot.destroy();
  }
}

/**
 * Step-series columns from change points: points = [{time, value}] in time order, extended
 * to `until` (now, for a live job) so the last level shows how long it has lasted.
 */
export function stepColumns(points, until) {
  const xs = points.map((p) => p.time);
  const ys = points.map((p) => p.value);
  if (xs.length && until !== null && until !== undefined && until > xs[xs.length - 1]) {
    xs.push(until);
    ys.push(ys[ys.length - 1]);
  }
  return [xs, ys];
}
