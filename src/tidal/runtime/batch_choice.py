"""The adaptive batch size's decision: the global batch that maximises goodput.

Pure functions over plain values, so the choice can be tested and reasoned about without a
loader, a process group or a gradient hook: the job's batch limits (:class:`BatchLimits`), the
step times measured per configuration (a :data:`Profile`) and the gradient noise scale
give a fitted :class:`~tidal.policy.api.ThroughputModel`; from it, the predicted goodput
(throughput x statistical efficiency) of each candidate global batch, and the best one.
:class:`tidal.runtime.adaptive.AdaptiveBatch` keeps the measurements and applies the choice.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from tidal.policy.api import ThroughputModel
from tidal.policy.goodput_model import (
    StepSample,
    accumulated_step_time,
    fit_throughput_model,
    statistical_gain,
)

#: A new batch at an epoch boundary must promise at least this much more goodput.
RECHOOSE_GAIN = 1.05
#: Candidate global batches tried per decision (log-spaced).
BATCH_CANDIDATES = 48

#: ``(workers, nodes, local batch, accumulation steps)``: one configuration a job ran in.
Configuration = tuple[int, int, float, int]
#: Recent ``(step time, exposed sync time)`` pairs, in seconds, per configuration.
Profile = dict[Configuration, list[tuple[float, float]]]


@dataclass(frozen=True)
class BatchLimits:
    """What bounds a job's global batch.

    ``init_batch`` is the batch autoscaling started from (gain 1, and the lower end);
    ``local_bounds=(lo, hi)`` bound each worker's share; with ``gradient_accumulation`` a
    share above ``hi`` is computed in ``ceil(share / hi)`` micro-batches, without it the
    global batch stops at ``hi`` per worker.
    """

    init_batch: int
    max_global: int
    local_bounds: tuple[int, int]
    gradient_accumulation: bool


def accumulation_steps(limits: BatchLimits, local: float) -> int:
    """Micro-batches one step needs for a per-worker share of ``local`` samples."""
    hi = limits.local_bounds[1]
    return max(1, math.ceil(local / hi)) if limits.gradient_accumulation else 1


def configuration(limits: BatchLimits, workers: int, batch: int) -> Configuration:
    """The profile key of global ``batch`` on ``workers`` (nodes are taken as one)."""
    local = batch / max(workers, 1)
    return (workers, 1, round(local, 3), accumulation_steps(limits, local))


def fitted_model(profile: Profile, noise_scale: float, limits: BatchLimits) -> ThroughputModel:
    """The throughput model fitted to ``profile``, with ``noise_scale`` and the batch limits
    (zero step-time terms while nothing has been measured)."""
    template = ThroughputModel.unfitted(
        grad_noise_scale=noise_scale,
        init_batch_size=limits.init_batch,
        max_local_batch=limits.local_bounds[1],
        max_global_batch=limits.max_global,
        # The scheduler plans with the batch range the runtime keeps (a share never below
        # the smallest, accumulation above the largest where the job allows it).
        min_local_batch=limits.local_bounds[0],
        gradient_accumulation=limits.gradient_accumulation,
    )
    samples = []
    for (workers, nodes, local, accumulation), times in profile.items():
        if not times:
            continue
        step = statistics.median(t for t, _ in times)
        sync = min(statistics.median(s for _, s in times), step)
        # Per micro-batch compute, so accumulation steps fit the same line.
        compute = (step - sync) / accumulation
        samples.append(StepSample(workers, nodes, local / accumulation, compute + sync, sync))
    if not samples:
        return template
    # The controller's simulator fits its profiles with the same function. With one
    # batch size seen it splits compute half fixed, half per sample (as AdaptDL does),
    # so that neither larger nor smaller batches look free before they are measured.
    return fit_throughput_model(samples, template)


def predicted_step_time(
    model: ThroughputModel, limits: BatchLimits, workers: int, batch: float
) -> float:
    """Seconds per step at global ``batch`` (with gradient accumulation if needed)."""
    local = batch / max(workers, 1)
    # The policy's rule too (goodput_model.goodput): one step, whichever side plans it.
    return float(accumulated_step_time(model, workers, 1, local, accumulation_steps(limits, local)))


def predicted_goodput(
    model: ThroughputModel, limits: BatchLimits, workers: int, batch: float
) -> float:
    """Initial-batch steps per second at global ``batch`` on ``workers``."""
    return float(statistical_gain(model, batch)) / predicted_step_time(
        model, limits, workers, batch
    )


def batch_range(limits: BatchLimits, workers: int) -> tuple[int, int]:
    """The global batches allowed for ``workers``."""
    lo, hi = limits.local_bounds
    high = limits.max_global
    if not limits.gradient_accumulation:
        high = min(high, hi * workers)
    low = min(max(limits.init_batch, lo * workers, workers), high)
    return low, max(high, low)


def best_global_batch(model: ThroughputModel, limits: BatchLimits, workers: int) -> int:
    """The global batch that maximises predicted goodput for ``workers``, out of
    :data:`BATCH_CANDIDATES` log-spaced ones (the range's ends included)."""
    low, high = batch_range(limits, workers)
    grid = np.unique(np.round(np.geomspace(low, high, BATCH_CANDIDATES)).astype(int))
    candidates = sorted({*grid.tolist(), low, high})
    values = [predicted_goodput(model, limits, workers, b) for b in candidates]
    return int(candidates[int(np.argmax(values))])


def steps_to_next_look(noise_samples: int, rechoose_steps: int) -> int:
    """Steps from one look at the batch to the next: as many as the noise estimate had
    samples at this look, at most ``rechoose_steps``. A choice made on a young estimate is
    looked at again once the estimate has about doubled (3, 6, 12, ... samples), so an
    early decision is corrected early; a mature one every ``rechoose_steps``."""
    return min(max(noise_samples, 1), rechoose_steps)


def next_batch(
    model: ThroughputModel, limits: BatchLimits, workers: int, current: int, reason: str
) -> tuple[int, float]:
    """The batch to train at from now on, and its predicted goodput over ``current``'s.

    ``reason`` is why the batch is looked at: ``"world"`` (the workers changed: take the
    best) or ``"epoch"`` (an epoch boundary: move only when the predicted goodput gain is
    at least :data:`RECHOOSE_GAIN`). Returns ``current`` when the batch stays.
    """
    best = best_global_batch(model, limits, workers)
    if best == current:
        return current, 1.0
    gain = predicted_goodput(model, limits, workers, best) / max(
        predicted_goodput(model, limits, workers, current), 1e-30
    )
    if reason == "epoch" and gain < RECHOOSE_GAIN:
        return current, gain
    return best, gain
