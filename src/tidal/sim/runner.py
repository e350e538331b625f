"""Glue between data on disk, policies and the engine: one call per simulation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from tidal.policy.registry import POLICIES, simulated_policy
from tidal.policy.team_queues import TeamQueues, pool_capacity
from tidal.policy.teams import Team, check_quotas
from tidal.sim.engine import SimConfig, SimResult, Simulator, isolated_time
from tidal.sim.profiles import ModelProfile
from tidal.sim.workload import WorkloadJob, load_philly, synthesize_workload


def simulate(
    policy_name: str,
    workload: Sequence[WorkloadJob],
    profiles: Mapping[str, ModelProfile],
    config: SimConfig,
    teams: Sequence[Team] | None = None,
) -> SimResult:
    """Replay ``workload`` through a fresh policy called ``policy_name``, shared over
    ``teams``' queues when given (each job in its ``team``)."""
    policy = simulated_policy(policy_name, config.reallocation_cost)
    if teams is not None:
        check_quotas(teams, pool_capacity(config.cluster()))
        policy = TeamQueues(policy, teams)
    return Simulator(policy, POLICIES[policy_name].sizing, profiles, config).run(workload)


def synthetic_workload(
    philly_csv: Path,
    profiles: dict[str, ModelProfile],
    num_jobs: int,
    load: float,
    config: SimConfig,
    seed: int,
) -> list[WorkloadJob]:
    """A seeded workload sampled from the Philly trace for ``config``'s cluster."""
    one_gpu = {
        name: isolated_time(profile, 1, profile.init_batch, config)
        for name, profile in profiles.items()
    }
    return synthesize_workload(
        load_philly(philly_csv),
        profiles,
        one_gpu,
        num_jobs=num_jobs,
        total_gpus=config.nodes * config.gpus_per_node,
        load=load,
        seed=seed,
    )
