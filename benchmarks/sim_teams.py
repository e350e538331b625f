"""Team queues on a multi-team replay of the Philly trace: each team's average JCT and how
often its guarantee was honoured, with team queues and with one flat queue.

Jobs are sampled from the Philly trace (each in the team of its virtual cluster) and run
twice with the same policy: once through ``--teams`` (hierarchical: guarantees, then
weight, then the policy within each team) and once through the policy alone (one queue).
Both runs are measured against the same guarantees.

    PYTHONPATH=src python benchmarks/sim_teams.py [--jobs 600 --load 2 --seed 1]
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tidal.sim.engine import SimConfig
from tidal.sim.locations import DEFAULT_PHILLY, DEFAULT_PROFILES
from tidal.sim.profiles import load_profiles
from tidal.sim.runner import simulate, synthetic_workload
from tidal.sim.team_summary import team_summaries
from tidal.wire.teams_file import load_teams

TEAMS = Path(__file__).with_name("teams_philly.yaml")


def main(
    jobs: Annotated[int, typer.Option(help="Jobs sampled from the trace.")] = 600,
    load: Annotated[float, typer.Option(help="Offered load.")] = 2.0,
    seed: Annotated[int, typer.Option(help="Seed of the sample.")] = 1,
    policy: Annotated[str, typer.Option(help="The policy within each team.")] = "fairshare",
    teams: Annotated[Path, typer.Option(help="Teams file.")] = TEAMS,
    profiles: Annotated[Path, typer.Option(help="Model profiles.")] = DEFAULT_PROFILES,
    philly: Annotated[Path, typer.Option(help="The Philly trace.")] = DEFAULT_PHILLY,
) -> None:
    """Print the markdown table: per team, average JCT and guarantee honoured, both ways."""
    config = SimConfig(nodes=16, gpus_per_node=4)
    model_profiles = load_profiles(profiles)
    trace = synthetic_workload(philly, model_profiles, jobs, load, config, seed)
    team_list = load_teams(teams)
    queued = team_summaries(
        simulate(policy, trace, model_profiles, config, team_list), trace, team_list
    )
    flat = {
        s.team: s
        for s in team_summaries(simulate(policy, trace, model_profiles, config), trace, team_list)
    }
    print(
        f"{jobs} jobs sampled from {philly.name} (load {load}, seed {seed}) on 16x4 GPUs, "
        f"{policy} within each team"
    )
    print()
    print(
        "| team | guaranteed | jobs | avg JCT, team queues (s) | avg JCT, one queue (s) "
        "| guarantee honoured, team queues | guarantee honoured, one queue |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for s in queued:
        f = flat[s.team]
        print(
            f"| {s.team} | {s.guaranteed} | {s.jobs} | {s.avg_jct:,.0f} | {f.avg_jct:,.0f} "
            f"| {s.honoured_share:.1%} | {f.honoured_share:.1%} |"
        )


if __name__ == "__main__":
    typer.run(main)
