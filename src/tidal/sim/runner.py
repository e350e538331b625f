"""Glue between data on disk, policies and the engine: one call per simulation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from tidal.policy.registry import POLICIES, simulated_policy
from tidal.sim.engine import SimConfig, SimResult, Simulator, isolated_time
from tidal.sim.profiles import ModelProfile
from tidal.sim.workload import WorkloadJob, load_philly, synthesize_workload


def simulate(
    policy_name: str,
    workload: Sequence[WorkloadJob],
    profiles: Mapping[str, ModelProfile],
    config: SimConfig,
) -> SimResult:
    """Replay ``workload`` through a fresh policy called ``policy_name``."""
    policy = simulated_policy(policy_name, config.reallocation_cost)
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
