"""How long one scheduling decision takes, at the controller's and at data-centre scale.

Jobs come from the Philly trace mapped onto the profiled models (as the simulator samples
them), each with its fitted throughput model at a random point of its training. Every trial
times one decision that starts from the previous decision's allocation with a tenth of the
jobs finished and as many new ones, so placement has slots to keep and slots to find.
Prints the median. A second table times the whole-replicas wrapper the controller puts
around any policy (:mod:`tidal.policy.whole_replicas`) when half of the jobs' workers hold
two GPUs each, beside the policy alone on the same jobs, and prints the ratio.

    PYTHONPATH=src python benchmarks/policy_decision_time.py [--profiles DIR] [--trials 5]
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from tidal.policy.api import Cluster, Host, JobRequest, Policy
from tidal.policy.fairshare import FairSharePolicy
from tidal.policy.goodput import GoodputPolicy
from tidal.policy.goodput_model import noise_scale
from tidal.policy.whole_replicas import WholeReplicas
from tidal.sim.engine import SimConfig
from tidal.sim.locations import DEFAULT_PHILLY, DEFAULT_PROFILES
from tidal.sim.profiles import ModelProfile, load_profiles
from tidal.sim.runner import synthetic_workload

console = Console()


def requests(
    profiles: dict[str, ModelProfile], philly: Path, count: int, gpus: int, seed: int
) -> list[JobRequest]:
    """``count`` job requests for a cluster of ``gpus``, elastic between 1 and what they can use."""
    config = SimConfig(nodes=max(1, gpus // 4), gpus_per_node=4)
    workload = synthetic_workload(philly, profiles, count, 1.0, config, seed)
    rng = np.random.default_rng(seed)
    jobs = []
    for job in workload:
        profile = profiles[job.model]
        progress = float(rng.uniform(0, profile.target_progress))
        sqr, var = profile.grad_stats(progress)
        model = replace(
            profile.throughput, grad_noise_scale=noise_scale(sqr, var, profile.init_batch)
        )
        useful = max(1, profile.max_batch // max(profile.min_local_batch, 1))
        jobs.append(
            JobRequest(
                job_id=job.name,
                min_slots=1,
                max_slots=min(useful, gpus),
                priority=int(rng.choice([5000, 5000, 5000, 10000])),
                submitted_at=job.submit_time,
                throughput=model,
                age=3600.0,
                reallocations=1,
            )
        )
    return jobs


def half_wide(jobs: list[JobRequest], slots: int) -> list[JobRequest]:
    """Every other job with workers of two slots each (its bounds counted in slots)."""
    return [
        replace(
            j,
            replica_slots=2,
            min_slots=2,
            max_slots=max(2, min(2 * j.max_slots, slots) // 2 * 2),
        )
        if i % 2
        else j
        for i, j in enumerate(jobs)
    ]


def time_decisions(
    policy: Policy, pool: list[JobRequest], count: int, cluster: Cluster, trials: int
) -> float:
    """Median seconds of one ``count``-job decision; a tenth of the jobs turn over per trial."""
    step = max(1, count // 10)
    previous = policy.allocate(pool[:count], cluster, {})
    seconds = []
    for trial in range(1, trials + 1):
        current = pool[trial * step : trial * step + count]
        started = time.perf_counter()
        previous = policy.allocate(current, cluster, previous)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def main(
    profiles: Annotated[Path, typer.Option(help="Folder of model profiles.")] = DEFAULT_PROFILES,
    philly: Annotated[Path, typer.Option(help="Philly trace.")] = DEFAULT_PHILLY,
    trials: Annotated[int, typer.Option(min=1)] = 5,
) -> None:
    """Time goodput and fairshare decisions at three scales."""
    model_profiles = load_profiles(profiles)
    cases = [
        ("goodput", 160, 16, 4, 1.0),
        ("fairshare", 160, 16, 4, None),
        # With more jobs than GPUs everyone gets one; fewer jobs make the greedy search work.
        ("goodput", 40, 16, 4, 1.0),
        ("goodput", 2000, 1024, 4, 10.0),
        ("fairshare", 2000, 1024, 4, None),
        ("fairshare", 1000, 512, 8, 0.05),
    ]
    table = Table(title=f"one decision, median of {trials}")
    for column in ("policy", "jobs", "hosts x slots", "GPUs", "median", "target"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for name, count, hosts, per_host, target in cases:
        cluster = Cluster(tuple(Host(f"h{i:04d}", per_host) for i in range(hosts)))
        pool = requests(
            model_profiles,
            philly,
            count + count // 10 * (trials + 1),
            cluster.total_slots,
            seed=count,
        )
        policy: Policy = GoodputPolicy() if name == "goodput" else FairSharePolicy()
        seconds = time_decisions(policy, pool, count, cluster, trials)
        table.add_row(
            name,
            str(count),
            f"{hosts} x {per_host}",
            str(cluster.total_slots),
            f"{seconds * 1000:.1f} ms",
            "-" if target is None else f"≤ {target * 1000:.0f} ms",
        )
    console.print(table)
    console.print(wide_table(model_profiles, philly, trials))


def _policy(name: str) -> Policy:
    return GoodputPolicy() if name == "goodput" else FairSharePolicy()


def wide_table(profiles: dict[str, ModelProfile], philly: Path, trials: int) -> Table:
    """The whole-replicas wrapper's cost: half the jobs with workers of two GPUs, the
    policy alone and wrapped timed on the same jobs in the same run."""
    table = Table(title=f"half the jobs with 2-GPU workers, median of {trials}")
    for column in ("policy", "jobs", "hosts x slots", "alone", "whole replicas", "ratio"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for name, count, hosts, per_host in (
        ("goodput", 160, 16, 4),
        ("fairshare", 160, 16, 4),
        ("fairshare", 2000, 1024, 4),
    ):
        cluster = Cluster(tuple(Host(f"h{i:04d}", per_host) for i in range(hosts)))
        size = count + count // 10 * (trials + 1)
        pool = half_wide(
            requests(profiles, philly, size, cluster.total_slots, seed=count), cluster.total_slots
        )

        alone = time_decisions(_policy(name), pool, count, cluster, trials)
        whole = time_decisions(WholeReplicas(_policy(name)), pool, count, cluster, trials)
        table.add_row(
            name,
            str(count),
            f"{hosts} x {per_host}",
            f"{alone * 1000:.1f} ms",
            f"{whole * 1000:.1f} ms",
            f"{whole / alone:.2f}x",
        )
    return table


if __name__ == "__main__":
    typer.run(main)
