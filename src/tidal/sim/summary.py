"""Summary numbers of a simulation: completion times, utilisation, churn, fairness."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tidal.sim.engine import SimResult


@dataclass(frozen=True)
class Summary:
    """Headline metrics of one run (times in seconds)."""

    policy: str
    jobs: int
    finished: int
    avg_jct: float
    median_jct: float
    p99_jct: float
    makespan: float
    gpu_utilisation: float
    reallocations_per_job: float
    #: Finish-time fairness: JCT over the job's run time alone at its requested size;
    #: mean and worst over jobs (lower is better, < 1 means faster than running alone).
    ftf_mean: float
    ftf_max: float

    def as_dict(self) -> dict[str, Any]:
        """Plain dict, for JSON."""
        return asdict(self)


def summarise(result: SimResult) -> Summary:
    """Compute the headline metrics of ``result``."""
    done = [job for job in result.jobs if job.finish_time is not None]
    jcts = np.array([job.jct for job in done if job.jct is not None], dtype=float)
    first = min((job.submit_time for job in result.jobs), default=0.0)
    last = max((job.finish_time for job in done if job.finish_time is not None), default=first)
    makespan = last - first
    used = sum(job.gpu_seconds for job in result.jobs)
    ftf = np.array(
        [
            job.jct / job.isolated_time
            for job in done
            if job.jct is not None and job.isolated_time > 0
        ]
    )

    def stat(values: np.ndarray, fn: str, q: float = 50.0) -> float:
        if values.size == 0:
            return float("nan")
        if fn == "mean":
            return float(values.mean())
        if fn == "max":
            return float(values.max())
        return float(np.percentile(values, q))

    return Summary(
        policy=result.policy,
        jobs=len(result.jobs),
        finished=len(done),
        avg_jct=stat(jcts, "mean"),
        median_jct=stat(jcts, "pct", 50.0),
        p99_jct=stat(jcts, "pct", 99.0),
        makespan=makespan,
        gpu_utilisation=used / (result.total_gpus * makespan) if makespan > 0 else 0.0,
        reallocations_per_job=float(np.mean([j.reallocations for j in result.jobs]))
        if result.jobs
        else 0.0,
        ftf_mean=stat(ftf, "mean"),
        ftf_max=stat(ftf, "max"),
    )
