"""Average job completion time of each policy on the eight half-load Pollux workloads.

Runs every workload with every policy at each reallocation cost (30 s: checkpoint-restart;
1 s: tidal's in-process rescale), prints average JCT per workload and policy, the mean over
workloads and the ratios goodput/static and goodput/tiresias, and optionally writes the
markdown tables and charts (JCT CDF, GPUs per job over time).

    PYTHONPATH=src python benchmarks/sim_policies.py [--costs 30,1] [--img-dir docs/img]
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tidal.sim.cli import comparison_markdown
from tidal.sim.engine import SimConfig, SimResult
from tidal.sim.locations import DEFAULT_PROFILES, DEFAULT_WORKLOADS
from tidal.sim.metrics import summarise
from tidal.sim.profiles import load_profiles
from tidal.sim.runner import simulate
from tidal.sim.workload import load_workload

console = Console()


def main(
    profiles: Annotated[Path, typer.Option(help="Folder of model profiles.")] = DEFAULT_PROFILES,
    workloads: Annotated[Path, typer.Option(help="Folder of workload-*.csv.")] = DEFAULT_WORKLOADS,
    policies: Annotated[str, typer.Option(help="Comma-separated policies.")] = (
        "static,tiresias,fairshare,goodput"
    ),
    costs: Annotated[str, typer.Option(help="Reallocation costs (s), comma-separated.")] = "30,1",
    img_dir: Annotated[Path | None, typer.Option(help="Write charts here.")] = None,
    markdown: Annotated[Path | None, typer.Option(help="Write the tables here.")] = None,
) -> None:
    """Simulate, then print the JCT table and ratios per reallocation cost."""
    names = [p.strip() for p in policies.split(",") if p.strip()]
    files = sorted(workloads.glob("workload-*.csv"), key=lambda p: (len(p.name), p.name))
    traces = {path.stem: load_workload(path) for path in files}
    model_profiles = load_profiles(profiles)
    sections = []
    for cost in (float(c) for c in costs.split(",")):
        config = SimConfig(reallocation_cost=cost)
        results: dict[str, list[SimResult]] = {name: [] for name in names}
        started = time.perf_counter()
        for trace in traces.values():
            for name in names:
                results[name].append(simulate(name, trace, model_profiles, config))
        elapsed = time.perf_counter() - started
        means = {
            name: sum(summarise(run).avg_jct for run in runs) / len(runs)
            for name, runs in results.items()
        }
        table = Table(
            title=f"average JCT (s), reallocation cost {cost:g} s ({elapsed:.0f} s to run)"
        )
        table.add_column("workload")
        for name in names:
            table.add_column(name, justify="right")
        for i, workload in enumerate(traces):
            table.add_row(workload, *(f"{summarise(results[n][i]).avg_jct:.0f}" for n in names))
        table.add_row("mean", *(f"{means[n]:.0f}" for n in names), style="bold")
        console.print(table)
        ratios = []
        for base in ("static", "tiresias", "fairshare"):
            if "goodput" in means and base in means:
                ratio = means["goodput"] / means[base]
                ratios.append(f"goodput/{base} = {ratio:.2f}")
        console.print("  ".join(ratios))
        sections.append(
            f"### Reallocation cost {cost:g} s\n\n"
            + comparison_markdown(list(traces), results)
            + "\n"
            + ", ".join(ratios)
            + "\n"
        )
        if img_dir is not None:
            from tidal.sim.plots import plot_gpus_per_job, plot_jct_cdf

            img_dir.mkdir(parents=True, exist_ok=True)
            tag = f"{cost:g}s"
            plot_jct_cdf(
                results,
                img_dir / f"sim-jct-cdf-{tag}.png",
                f"all {len(traces)} workloads, reallocation cost {cost:g} s",
            )
            first = {name: runs[0] for name, runs in results.items()}
            plot_gpus_per_job(
                first,
                img_dir / f"sim-gpus-per-job-{tag}.png",
                f"{next(iter(traces))}, reallocation cost {cost:g} s",
            )
    if markdown is not None:
        markdown.write_text("\n".join(sections))


if __name__ == "__main__":
    typer.run(main)
