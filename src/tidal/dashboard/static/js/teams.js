// Each team's slots over time against its guaranteed quota and its limit, one small chart
// per team (server run with --teams; the card stays hidden without team queues). Data: the
// `teams` of GET /cluster/usage. What a team borrowed (above its guarantee) and lent (its
// idle guarantee that others used) are series of their own.
//
// Each chart's element (#team-chart-<team>, data-team) keeps what it draws in
// data-points (times, used, guaranteed, [limit,] borrowed, lent), as charts.js does.
import { Chart } from "./charts.js";
import { fill, h } from "./dom.js";

const COLOURS = { used: "#2563eb", guaranteed: "#16a34a", limit: "#475569", borrowed: "#ea580c", lent: "#9333ea" };

/** One team's chart and its figures now. */
function teamChart(team) {
  const box = h("div", { class: "chart", id: `team-chart-${team.team}`, dataset: { team: team.team } });
  const now = h("div", { class: "small muted team-now" });
  const series = [
    { label: "used", colour: COLOURS.used, stepped: true, fill: true },
    { label: "guaranteed", colour: COLOURS.guaranteed, stepped: true, dash: [6, 4] },
    ...(team.limit === null ? [] : [{ label: "limit", colour: COLOURS.limit, stepped: true, dash: [2, 3] }]),
    { label: "borrowed", colour: COLOURS.borrowed, stepped: true },
    { label: "lent", colour: COLOURS.lent, stepped: true },
  ];
  const block = h("div", { class: "team-block", dataset: { team: team.team } },
    h("h3", {}, team.team), now, box);
  return { block, box, now, series };
}

/** The team card: build it in `view`; returns {update(usage), destroy()}. */
export function teamCard(view) {
  const grid = h("div", { class: "team-charts", id: "team-charts" });
  const card = h("section", { class: "card", id: "team-card", hidden: true },
    h("h2", {}, "Teams", h("span", { class: "muted small" },
      " — each team's slots over time; dashed: its guarantee, dotted: its limit")),
    grid);
  view.append(card);
  let charts = new Map();
  let key = "";

  const build = (teams) => {
    for (const c of charts.values()) c.chart.destroy();
    charts = new Map();
    fill(grid, teams.map((team) => {
      const parts = teamChart(team);
      charts.set(team.team, parts);
      return parts.block;
    }));
    // uPlot measures its box when built: build after the blocks are in the page.
    for (const [name, parts] of charts) {
      const team = teams.find((t) => t.team === name);
      parts.chart = new Chart(parts.box, parts.series, {
        height: 160, integer: true, yLabel: "slots", yMax: Math.max(team.guaranteed, team.limit ?? 0),
      });
    }
  };

  return {
    update(usage) {
      const teams = usage.teams ?? [];
      card.hidden = teams.length === 0;
      const shape = JSON.stringify(teams.map((t) => [t.team, t.guaranteed, t.limit]));
      if (shape !== key) {
        build(teams);
        key = shape;
      }
      for (const team of teams) {
        const { chart, now } = charts.get(team.team);
        const level = (n) => usage.times.map(() => n);
        chart.setData([
          usage.times, team.slots, level(team.guaranteed),
          ...(team.limit === null ? [] : [level(team.limit)]),
          team.borrowed, team.lent,
        ]);
        const last = (xs) => xs[xs.length - 1] ?? 0;
        const limit = team.limit === null ? "no limit" : `limit ${team.limit}`;
        now.textContent = `${last(team.slots)} used · guarantee ${team.guaranteed} · ${limit}`
          + ` · borrowed ${last(team.borrowed)} · lent ${last(team.lent)}`;
      }
    },
    destroy() {
      for (const c of charts.values()) c.chart.destroy();
    },
  };
}
