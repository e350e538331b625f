"""Average job completion time of each policy on the eight half-load Pollux workloads.

Runs every workload with every policy at each reallocation cost (30 s: checkpoint-restart;
1 s: tidal's in-process rescale), prints average JCT per workload and policy, the mean over
workloads and the ratios goodput/static and goodput/tiresias, and optionally writes the
markdown tables and charts (JCT CDF, GPUs per job over time).

    PYTHONPATH=src python benchmarks/sim_policies.py [--costs 30,1] [--img-dir docs/img]

With ``--reference REFERENCE.md`` (the artifact's per-workload averages) it instead puts
tidal's runs beside the Pollux artifact's: its Tiresias against ``tiresias-artifact`` and
its Pollux against ``goodput``, with p99, makespan and reallocations per job.
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
from tidal.sim.profiles import ModelProfile, load_profiles
from tidal.sim.runner import simulate
from tidal.sim.summary import summarise
from tidal.sim.workload import WorkloadJob, load_workload

console = Console()


def read_reference(path: Path) -> dict[str, dict[str, float]]:
    """``{workload: {policy: average JCT}}`` from the artifact's markdown table."""
    lines = [line for line in path.read_text().splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    table: dict[str, dict[str, float]] = {}
    for line in lines[2:]:
        cells = [cell.strip().strip("*") for cell in line.strip("|").split("|")]
        if cells[0].startswith("workload"):
            table[cells[0]] = {h: float(c) for h, c in zip(header[1:], cells[1:], strict=True)}
    return table


def against_artifact(
    traces: dict[str, list[WorkloadJob]],
    model_profiles: dict[str, ModelProfile],
    reference: dict[str, dict[str, float]],
    config: SimConfig,
    policies: list[str],
) -> tuple[str, dict[str, list[SimResult]]]:
    """Markdown table of tidal's runs beside the artifact's figures, and the runs."""
    results: dict[str, list[SimResult]] = {name: [] for name in policies}
    for trace in traces.values():
        for name in policies:
            results[name].append(simulate(name, trace, model_profiles, config))
    columns = ["artifact tiresias", "tiresias-artifact", "artifact pollux", *policies[1:]]
    lines = [
        "| workload | " + " | ".join(columns) + " | goodput / pollux |",
        "|---" * (len(columns) + 2) + "|",
    ]
    sums = [0.0] * (len(columns) + 1)
    for i, workload in enumerate(traces):
        ours = [summarise(results[name][i]).avg_jct for name in policies]
        row = [reference[workload]["tiresias"], ours[0], reference[workload]["pollux"], *ours[1:]]
        ratio = ours[policies.index("goodput")] / reference[workload]["pollux"]
        sums = [a + b for a, b in zip(sums, [*row, ratio], strict=True)]
        lines.append(f"| {workload} | " + " | ".join(f"{v:.1f}" for v in row) + f" | {ratio:.3f} |")
    n = len(traces)
    lines.append(
        "| **mean** | "
        + " | ".join(f"**{v / n:.1f}**" for v in sums[:-1])
        + f" | {sums[-1] / n:.3f} |"
    )
    lines.append("")
    lines.append("| policy | mean p99 JCT | mean makespan | reallocations per job |")
    lines.append("|---|---:|---:|---:|")
    for name in policies:
        summaries = [summarise(run) for run in results[name]]
        lines.append(
            f"| {name} | {sum(s.p99_jct for s in summaries) / n:.0f} | "
            f"{sum(s.makespan for s in summaries) / n:.0f} | "
            f"{sum(s.reallocations_per_job for s in summaries) / n:.2f} |"
        )
    return "\n".join(lines) + "\n", results


def main(
    profiles: Annotated[Path, typer.Option(help="Folder of model profiles.")] = DEFAULT_PROFILES,
    workloads: Annotated[Path, typer.Option(help="Folder of workload-*.csv.")] = DEFAULT_WORKLOADS,
    policies: Annotated[str, typer.Option(help="Comma-separated policies.")] = (
        "static,tiresias,fairshare,goodput"
    ),
    costs: Annotated[str, typer.Option(help="Reallocation costs (s), comma-separated.")] = "30,1",
    img_dir: Annotated[Path | None, typer.Option(help="Write charts here.")] = None,
    markdown: Annotated[Path | None, typer.Option(help="Write the tables here.")] = None,
    reference: Annotated[
        Path | None, typer.Option(help="The artifact's REFERENCE.md: compare against it.")
    ] = None,
    interval: Annotated[float, typer.Option(help="Seconds between decisions.")] = 60.0,
) -> None:
    """Simulate, then print the JCT table and ratios per reallocation cost."""
    names = [p.strip() for p in policies.split(",") if p.strip()]
    files = sorted(workloads.glob("workload-*.csv"), key=lambda p: (len(p.name), p.name))
    traces = {path.stem: load_workload(path) for path in files}
    model_profiles = load_profiles(profiles)
    sections = []
    if reference is not None:
        figures = read_reference(reference)
        for cost in (float(c) for c in costs.split(",")):
            config = SimConfig(reallocation_cost=cost, interval=interval)
            started = time.perf_counter()
            text, runs = against_artifact(
                traces, model_profiles, figures, config, ["tiresias-artifact", *names]
            )
            heading = f"### Reallocation cost {cost:g} s, a decision every {interval:g} s"
            console.print(heading, f"({time.perf_counter() - started:.0f} s to run)")
            console.print(text)
            sections.append(heading + "\n\n" + text)
            if img_dir is not None:
                from tidal.sim.plots import plot_job_sizes

                img_dir.mkdir(parents=True, exist_ok=True)
                position = list(traces).index("workload-6") if "workload-6" in traces else 0
                for name in names:
                    plot_job_sizes(
                        runs[name][position],
                        img_dir / f"sim-job-sizes-{name}-{cost:g}s.png",
                        f"{list(traces)[position]}, {name}, reallocation cost {cost:g} s",
                    )
        if markdown is not None:
            markdown.write_text("\n".join(sections))
        return
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
            first = {name: runs[:1] for name, runs in results.items()}
            plot_gpus_per_job(
                first,
                img_dir / f"sim-gpus-per-job-{tag}.png",
                f"{next(iter(traces))}, reallocation cost {cost:g} s",
            )
    if markdown is not None:
        markdown.write_text("\n".join(sections))


if __name__ == "__main__":
    typer.run(main)
