"""``tidal sim``: replay workloads through the scheduling policies.

``sim_app`` is a Typer sub-application: ``run`` simulates one workload with one policy,
``compare`` every workload of a folder with several policies (markdown table and charts).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from tidal.policy.registry import SIMULATED
from tidal.policy.teams import TeamQuotaError
from tidal.sim.engine import SimConfig, SimResult
from tidal.sim.locations import DEFAULT_PHILLY, DEFAULT_PROFILES, DEFAULT_WORKLOADS
from tidal.sim.profiles import load_profiles
from tidal.sim.runner import simulate, synthetic_workload
from tidal.sim.summary import Summary, summarise
from tidal.sim.team_summary import TeamSummary, team_summaries
from tidal.sim.workload import WorkloadJob, load_workload
from tidal.wire.teams_file import load_teams

log = logging.getLogger(__name__)
console = Console()
T = TypeVar("T")

sim_app = typer.Typer(
    help="Replay cluster workloads through tidal's scheduling policies.", no_args_is_help=True
)

ProfilesOpt = Annotated[Path, typer.Option("--profiles", help="Folder of model profiles.")]
NodesOpt = Annotated[int, typer.Option("--nodes", min=1, help="Nodes in the simulated cluster.")]
GpusOpt = Annotated[int, typer.Option("--gpus-per-node", min=1, help="GPUs per node.")]
IntervalOpt = Annotated[
    float, typer.Option("--interval", min=1.0, help="Seconds between scheduling decisions.")
]
CostOpt = Annotated[
    float,
    typer.Option("--realloc-cost", min=0.0, help="Seconds without progress per allocation change."),
]


def _check_policy(name: str) -> str:
    """Reject unknown policy names with the list of known ones."""
    if name not in SIMULATED:
        raise typer.BadParameter(f"unknown policy {name!r}; choose from {', '.join(SIMULATED)}")
    return name


def _read(flag: str, path: Path, reader: Callable[[], T]) -> T:
    """``reader()``, with a missing or unreadable file of ``flag`` told as a usage error
    naming the flag and the path (one line, no traceback)."""
    if not path.exists():
        raise typer.BadParameter(f"{path} does not exist", param_hint=flag)
    try:
        return reader()
    except (OSError, ValueError, KeyError) as exc:
        what = f"missing column {exc}" if isinstance(exc, KeyError) else str(exc)
        raise typer.BadParameter(f"cannot read {path}: {what}", param_hint=flag) from None


def _summary_table(summaries: list[Summary], title: str) -> Table:
    """A rich table of headline metrics: one row per metric, one column per run."""
    table = Table(title=title)
    table.add_column("metric")
    for s in summaries:
        table.add_column(s.policy, justify="right")
    rows: list[tuple[str, list[str]]] = [
        ("jobs finished", [f"{s.finished}/{s.jobs}" for s in summaries]),
        ("average JCT", [f"{s.avg_jct:,.0f} s" for s in summaries]),
        ("median JCT", [f"{s.median_jct:,.0f} s" for s in summaries]),
        ("p99 JCT", [f"{s.p99_jct:,.0f} s" for s in summaries]),
        ("makespan", [f"{s.makespan / 3600:.1f} h" for s in summaries]),
        ("GPU utilisation", [f"{s.gpu_utilisation:.0%}" for s in summaries]),
        ("reallocations per job", [f"{s.reallocations_per_job:.2f}" for s in summaries]),
        ("finish-time fairness, mean", [f"{s.ftf_mean:.2f}" for s in summaries]),
        ("finish-time fairness, worst", [f"{s.ftf_max:.2f}" for s in summaries]),
    ]
    for label, values in rows:
        table.add_row(label, *values)
    return table


def _team_table(summaries: list[TeamSummary]) -> Table:
    """Per team: guarantee, jobs, average JCT, slots held and borrowed, guarantee honoured."""
    table = Table(title="team queues")
    for name in ("team", "guar.", "jobs", "avg JCT", "used", "borrowed", "honoured"):
        table.add_column(name, justify="left" if name == "team" else "right")
    for s in summaries:
        table.add_row(
            s.team,
            str(s.guaranteed),
            f"{s.finished}/{s.jobs}",
            f"{s.avg_jct:,.0f} s",
            f"{s.mean_used:.1f}",
            f"{s.mean_borrowed:.1f}",
            f"{s.honoured_share:.1%}",
        )
    return table


def _write_jobs(result: SimResult, path: Path) -> None:
    """One JSON line per job."""
    with path.open("w") as handle:
        for job in result.jobs:
            record = {
                "policy": result.policy,
                "name": job.name,
                "model": job.model,
                "submit_time": job.submit_time,
                "start_time": job.start_time,
                "finish_time": job.finish_time,
                "jct": job.jct,
                "reallocations": job.reallocations,
                "gpu_seconds": job.gpu_seconds,
                "isolated_time": job.isolated_time,
            }
            handle.write(json.dumps(record) + "\n")


@sim_app.command()
def run(
    policy: Annotated[
        str, typer.Option("--policy", help=f"One of: {', '.join(SIMULATED)}.")
    ] = "goodput",
    workload: Annotated[
        Path | None,
        typer.Option("--workload", help="Workload CSV; omit to sample one from the Philly trace."),
    ] = None,
    profiles: ProfilesOpt = DEFAULT_PROFILES,
    nodes: NodesOpt = 16,
    gpus_per_node: GpusOpt = 4,
    interval: IntervalOpt = 60.0,
    realloc_cost: CostOpt = 30.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sampled workload.")] = 0,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="Jobs in a sampled workload.")] = 160,
    load: Annotated[
        float, typer.Option("--load", min=0.01, help="Offered load of a sampled workload.")
    ] = 0.5,
    philly: Annotated[
        Path, typer.Option("--philly", help="Philly trace to sample from.")
    ] = DEFAULT_PHILLY,
    output: Annotated[
        Path | None, typer.Option("--output", help="Write per-job results (JSON lines).")
    ] = None,
    teams: Annotated[
        Path | None,
        typer.Option("--teams", help="Teams file: jobs queue per team (workload column team)."),
    ] = None,
) -> None:
    """Simulate one workload with one policy and print a summary."""
    _check_policy(policy)
    team_list = _read("--teams", teams, lambda: load_teams(teams)) if teams else None
    config = SimConfig(
        nodes=nodes, gpus_per_node=gpus_per_node, interval=interval, reallocation_cost=realloc_cost
    )
    model_profiles = _read("--profiles", profiles, lambda: load_profiles(profiles))
    trace: list[WorkloadJob]
    if workload is not None:
        trace = _read("--workload", workload, lambda: load_workload(workload))
        source = workload.name
    else:
        trace = _read(
            "--philly",
            philly,
            lambda: synthetic_workload(philly, model_profiles, jobs, load, config, seed),
        )
        source = f"{jobs} jobs sampled from {philly.name} (load {load}, seed {seed})"
    try:
        result = simulate(policy, trace, model_profiles, config, team_list)
    except TeamQuotaError as exc:
        raise typer.BadParameter(str(exc), param_hint="--teams") from None
    console.print(_summary_table([summarise(result)], f"{source} on {nodes}x{gpus_per_node} GPUs"))
    if team_list is not None:
        console.print(_team_table(team_summaries(result, trace, team_list)))
    if result.decision_seconds:
        decisions = sorted(result.decision_seconds)
        console.print(
            f"{len(decisions)} decisions: median {decisions[len(decisions) // 2] * 1000:.1f} ms, "
            f"slowest {decisions[-1] * 1000:.1f} ms"
        )
    if output is not None:
        _write_jobs(result, output)
        console.print(f"per-job results: {output}")


@sim_app.command()
def compare(
    workloads: Annotated[
        Path, typer.Option("--workloads", help="Folder of workload-*.csv files.")
    ] = DEFAULT_WORKLOADS,
    policies: Annotated[
        str, typer.Option("--policies", help="Comma-separated policy names.")
    ] = ",".join(SIMULATED),
    profiles: ProfilesOpt = DEFAULT_PROFILES,
    nodes: NodesOpt = 16,
    gpus_per_node: GpusOpt = 4,
    interval: IntervalOpt = 60.0,
    realloc_cost: CostOpt = 30.0,
    output_dir: Annotated[
        Path, typer.Option("--output-dir", help="Where the table and charts go.")
    ] = Path("sim-results"),
) -> None:
    """Simulate every workload with every policy; write a markdown table and PNG charts."""
    from tidal.sim.plots import plot_gpus_per_job, plot_jct_cdf

    names = [_check_policy(p.strip()) for p in policies.split(",") if p.strip()]
    if not workloads.is_dir():
        raise typer.BadParameter(f"{workloads} is not a folder", param_hint="--workloads")
    files = sorted(workloads.glob("workload-*.csv"), key=lambda p: (len(p.name), p.name))
    if not files:
        raise typer.BadParameter(f"no workload-*.csv in {workloads}", param_hint="--workloads")
    config = SimConfig(
        nodes=nodes, gpus_per_node=gpus_per_node, interval=interval, reallocation_cost=realloc_cost
    )
    model_profiles = _read("--profiles", profiles, lambda: load_profiles(profiles))
    traces = {path: _read("--workloads", path, partial(load_workload, path)) for path in files}
    results: dict[str, list[SimResult]] = {name: [] for name in names}
    for path, trace in traces.items():
        for name in names:
            log.info("simulating %s with %s", path.name, name)
            results[name].append(simulate(name, trace, model_profiles, config))
    output_dir.mkdir(parents=True, exist_ok=True)
    markdown = comparison_markdown([p.stem for p in files], results)
    (output_dir / "comparison.md").write_text(markdown)
    plot_jct_cdf(results, output_dir / "jct_cdf.png", f"{len(files)} workloads")
    stems = [p.stem for p in files]
    plot_gpus_per_job(results, output_dir / "gpus_per_job.png", workloads=stems)
    for i, stem in enumerate(stems):
        console.print(_summary_table([summarise(runs[i]) for runs in results.values()], stem))
    console.print(markdown)
    console.print(f"written: {output_dir}/comparison.md, jct_cdf.png, gpus_per_job.png")


def comparison_markdown(workloads: list[str], results: dict[str, list[SimResult]]) -> str:
    """Average job completion time per workload and policy, their mean, and other metrics'
    means, each in the unit the terminal's tables use (JCT in seconds, makespan in hours,
    utilisation in percent), named in its row."""
    names = list(results)
    summaries = {name: [summarise(run) for run in runs] for name, runs in results.items()}
    lines = [
        "| average JCT (s), by workload | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for i, workload in enumerate(workloads):
        lines.append(
            f"| {workload} | " + " | ".join(f"{summaries[n][i].avg_jct:,.0f}" for n in names) + " |"
        )
    rows: list[tuple[str, str, Callable[[float], str]]] = [
        ("**mean average JCT (s)**", "avg_jct", lambda v: f"{v:,.0f}"),
        ("mean median JCT (s)", "median_jct", lambda v: f"{v:,.0f}"),
        ("mean p99 JCT (s)", "p99_jct", lambda v: f"{v:,.0f}"),
        ("mean makespan (h)", "makespan", lambda v: f"{v / 3600:.1f}"),
        ("mean GPU utilisation (%)", "gpu_utilisation", lambda v: f"{v:.0%}".rstrip("%")),
        ("reallocations per job", "reallocations_per_job", lambda v: f"{v:.2f}"),
        ("mean finish-time fairness (ratio)", "ftf_mean", lambda v: f"{v:.2f}"),
        ("worst finish-time fairness (ratio)", "ftf_max", lambda v: f"{v:.2f}"),
    ]
    for label, field, shown in rows:
        values = [sum(getattr(s, field) for s in summaries[n]) / len(summaries[n]) for n in names]
        lines.append(f"| {label} | " + " | ".join(shown(v) for v in values) + " |")
    return "\n".join(lines) + "\n"
