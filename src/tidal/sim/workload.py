"""Workloads: which jobs arrive when, from a trace file or sampled from the Philly trace."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tidal.sim.profiles import ModelProfile


@dataclass(frozen=True)
class WorkloadJob:
    """One job of a workload: the user's model and the size they tuned for it."""

    name: str
    submit_time: float
    model: str
    num_replicas: int
    batch_size: int
    #: The team whose queue the job waits in (``tidal sim run --teams``).
    team: str = "default"


def load_workload(path: Path) -> list[WorkloadJob]:
    """Read a ``name,time,application,num_replicas,batch_size[,team]`` workload file."""
    with path.open(newline="") as handle:
        jobs = [
            WorkloadJob(
                name=row["name"],
                submit_time=float(row["time"]),
                model=row["application"],
                num_replicas=int(row["num_replicas"]),
                batch_size=int(row["batch_size"]),
                team=row.get("team") or "default",
            )
            for row in csv.DictReader(handle)
        ]
    return sorted(jobs, key=lambda j: (j.submit_time, j.name))


@dataclass(frozen=True)
class PhillyJob:
    """One record of the Philly trace that matters here."""

    num_gpus: int
    gpu_time: float
    #: The virtual cluster that ran it: a sampled job's team.
    cluster: str = "default"


def load_philly(path: Path) -> list[PhillyJob]:
    """Read the Philly job records with a positive GPU count and GPU-time."""
    with path.open(newline="") as handle:
        records = []
        for row in csv.DictReader(handle):
            gpus, gpu_time = int(float(row["num_gpus"])), float(row["gpu_time"])
            if gpus > 0 and gpu_time > 0:
                records.append(PhillyJob(gpus, gpu_time, row.get("cluster") or "default"))
    return records


def synthesize_workload(
    philly: list[PhillyJob],
    profiles: dict[str, ModelProfile],
    gpu_seconds: dict[str, float],
    num_jobs: int,
    total_gpus: int,
    load: float,
    seed: int,
) -> list[WorkloadJob]:
    """Sample ``num_jobs`` Philly jobs and turn each into a profiled model's job.

    A Philly record keeps its GPU count (capped at the cluster) and picks the model whose
    GPU-time per replica (``gpu_seconds``, measured in isolation on one GPU) is closest to
    the record's on a log scale, and its virtual cluster is its team; the batch grows with
    the GPU count from the model's initial batch. Arrivals are Poisson, with the rate that
    offers ``load`` times the cluster's GPU capacity on average (using each job's one-GPU
    work as its demand).
    """
    if num_jobs <= 0:
        return []
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(philly), size=num_jobs)
    names = sorted(profiles)
    log_work = np.log([gpu_seconds[m] for m in names])
    jobs: list[tuple[str, int, int, float, str]] = []
    for pick in picks:
        record = philly[int(pick)]
        model = names[int(np.argmin(np.abs(log_work - math.log(record.gpu_time))))]
        profile = profiles[model]
        replicas = max(1, min(record.num_gpus, total_gpus))
        per_worker = min(profile.max_local_batch, max(profile.min_local_batch, profile.init_batch))
        batch = int(min(profile.max_batch, max(profile.init_batch, replicas * per_worker)))
        jobs.append((model, replicas, batch, gpu_seconds[model], record.cluster))
    mean_work = float(np.mean([work for _, _, _, work, _ in jobs]))
    rate = load * total_gpus / mean_work
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=num_jobs))
    arrivals -= arrivals[0]
    return [
        WorkloadJob(f"{model}-{i}", float(round(arrivals[i])), model, replicas, batch, team)
        for i, (model, replicas, batch, _, team) in enumerate(jobs)
    ]
