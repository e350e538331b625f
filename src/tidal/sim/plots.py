"""Charts of simulation results (matplotlib, headless)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

from tidal.sim.engine import SimResult


def _pyplot() -> ModuleType:
    """matplotlib's pyplot on the file-only Agg backend (imported late: optional extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_jct_cdf(
    results: Mapping[str, Sequence[SimResult]], path: Path, title: str | None = None
) -> None:
    """CDF of job completion times per policy, pooled over all its runs."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    for policy, runs in results.items():
        jcts = np.sort([j.jct for run in runs for j in run.jobs if j.jct is not None])
        if jcts.size:
            ax.step(
                jcts / 3600, np.arange(1, jcts.size + 1) / jcts.size, where="post", label=policy
            )
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.grid(True, alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _gpus_line(ax: object, run: SimResult, label: str) -> None:
    """Mean GPUs per running job of ``run`` over time, as one line of ``ax``."""
    times: list[float] = []
    means: list[float] = []
    for i, (at, held) in enumerate(run.timeline):
        if i and at - run.timeline[i - 1][0] > run.config.interval:
            # The cluster sat idle in between: break the line instead of bridging it.
            times.append(run.timeline[i - 1][0] / 3600 + run.config.interval / 3600)
            means.append(float("nan"))
        times.append(at / 3600)
        means.append(float(np.mean(list(held.values()))) if held else 0.0)
    ax.plot(times, means, label=label, linewidth=1, drawstyle="steps-post")  # type: ignore[attr-defined]


def plot_gpus_per_job(
    results: Mapping[str, Sequence[SimResult]],
    path: Path,
    title: str | None = None,
    workloads: Sequence[str] = (),
) -> int:
    """Mean GPUs per running job over time: one panel per workload (the policies' runs in
    the same order, named by ``workloads``), one line per policy in each. Returns the
    number of panels."""
    plt = _pyplot()
    count = max((len(runs) for runs in results.values()), default=0)
    cols = min(max(count, 1), 3)
    rows = max(1, math.ceil(count / cols))
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(6 if cols == 1 else 4 * cols, 3.6 if rows == 1 else 3 * rows),
        dpi=100,
        squeeze=False,
        sharey=True,
    )
    for i in range(rows * cols):
        ax = axes[i // cols][i % cols]
        if i >= count:
            ax.set_visible(False)
            continue
        for policy, runs in results.items():
            if i < len(runs):
                _gpus_line(ax, runs[i], policy)
        ax.set_xlabel("time (hours)")
        if i % cols == 0:
            ax.set_ylabel("GPUs per running job (mean)")
        ax.grid(True, alpha=0.3)
        if count > 1:
            ax.set_title(workloads[i] if i < len(workloads) else f"workload {i + 1}", fontsize=9)
    axes[0][0].legend()
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return count


def plot_job_sizes(run: SimResult, path: Path, title: str | None = None, least: int = 16) -> None:
    """GPUs held by each job over time, one line per job that ever held ``least`` or more.

    Small jobs are left out to keep the chart readable; a staircase (a job shrinking a
    few GPUs at a time, decision after decision) shows as a descending line of short steps.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.8), dpi=100)
    peaks: dict[str, int] = {}
    for _, held in run.timeline:
        for job, count in held.items():
            peaks[job] = max(peaks.get(job, 0), count)
    for job in sorted(j for j, peak in peaks.items() if peak >= least):
        times = [at / 3600 for at, _ in run.timeline]
        sizes = [held.get(job, 0) for _, held in run.timeline]
        ax.plot(times, sizes, linewidth=1, drawstyle="steps-post", label=job)
    ax.set_xlabel("time (hours)")
    ax.set_ylabel(f"GPUs held (jobs that reached {least})")
    ax.grid(True, alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
