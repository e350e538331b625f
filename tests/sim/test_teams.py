"""Team queues in the simulator: the workload's team column, the Philly trace's virtual
clusters as teams, and a guarantee a flat queue breaks and team queues honour."""

from __future__ import annotations

import csv
from pathlib import Path

from typer.testing import CliRunner

from tidal.policy.teams import Team
from tidal.sim.cli import sim_app
from tidal.sim.engine import SimConfig
from tidal.sim.profiles import ModelProfile
from tidal.sim.runner import simulate, synthetic_workload
from tidal.sim.team_summary import team_summaries
from tidal.sim.workload import WorkloadJob, load_workload

SMALL = SimConfig(nodes=4, gpus_per_node=4)


def test_the_team_column_is_read_and_optional(tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    path.write_text(
        "name,time,application,num_replicas,batch_size,team\n"
        "a,0,cifar10,2,128,vision\n"
        "b,5,cifar10,1,128,\n"
    )
    assert [j.team for j in load_workload(path)] == ["vision", "default"]
    path.write_text("name,time,application,num_replicas,batch_size\na,0,cifar10,2,128\n")
    assert [j.team for j in load_workload(path)] == ["default"]


def test_sampled_jobs_are_in_the_team_of_their_virtual_cluster(
    traces: Path, profiles: dict[str, ModelProfile]
) -> None:
    with (traces / "philly.csv").open(newline="") as handle:
        clusters = {row["cluster"] for row in csv.DictReader(handle)}
    jobs = synthetic_workload(traces / "philly.csv", profiles, 40, 1.0, SMALL, seed=1)
    teams = {j.team for j in jobs}
    assert teams <= clusters and len(teams) > 1


def test_a_guarantee_a_flat_queue_breaks_is_honoured_by_team_queues(
    profiles: dict[str, ModelProfile],
) -> None:
    """Team x fills all 16 GPUs with four jobs of 8; team y (guaranteed 8) then submits one
    job of 8: one flat queue gives it a fifth, team queues give it its 8."""
    model = max(profiles, key=lambda m: profiles[m].init_batch)
    batch = profiles[model].init_batch
    workload = [WorkloadJob(f"x{i}", 0.0, model, 8, batch, team="x") for i in range(4)]
    workload.append(WorkloadJob("y0", 120.0, model, 8, batch, team="y"))
    teams = [Team("x", guaranteed={None: 8}), Team("y", guaranteed={None: 8})]
    queued = simulate("fairshare", workload, profiles, SMALL, teams)
    flat = simulate("fairshare", workload, profiles, SMALL)
    honoured = {s.team: s for s in team_summaries(queued, workload, teams)}
    broken = {s.team: s for s in team_summaries(flat, workload, teams)}
    assert honoured["y"].asked > 0
    assert honoured["y"].honoured_share == 1.0 and honoured["x"].honoured_share == 1.0
    assert broken["y"].honoured_share < 1.0


def test_quotas_over_the_simulated_pool_are_a_usage_error(tmp_path: Path, traces: Path) -> None:
    teams = tmp_path / "teams.yaml"
    teams.write_text("teams:\n  - {name: a, guaranteed: 60}\n  - {name: b, guaranteed: 10}\n")
    argv = ["run", "--policy", "fairshare", "--teams", str(teams), "--jobs", "5"]
    argv += ["--profiles", str(traces / "pollux" / "profiles"), "--philly"]
    argv += [str(traces / "philly.csv")]
    result = CliRunner().invoke(sim_app, argv)
    assert result.exit_code == 2
    text = " ".join(w for w in result.output.split() if w != "│")
    assert "--teams" in text and "70 slots but the pool has 64: a (60), b (10)" in text, text
