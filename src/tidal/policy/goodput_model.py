"""Goodput arithmetic after Pollux (OSDI'21): step time, statistical efficiency, best batch.

Units: *progress* counts optimiser steps at the job's initial batch size, so a job's
goodput (progress per second) is ``gain(batch) / step_time``. ``gain`` is how many initial
-batch steps one step at ``batch`` is worth::

    gain = (var + sqr) / (var / scale + sqr),    scale = batch / init_batch

with ``sqr`` the squared gradient norm and ``var`` the gradient variance at the initial
batch. Only their ratio matters; a :class:`~tidal.policy.api.ThroughputModel` carries it as
``grad_noise_scale = init_batch * var / sqr`` (the gradient noise scale, in samples).

Step time for ``w`` workers on ``n`` nodes with per-worker batch ``b``::

    compute = alpha_compute + beta_compute * b
    sync    = 0                                        if w == 1
              alpha_sync_local + beta_sync_local * (w - 2)   if n == 1
              alpha_sync_node + beta_sync_node * (w - 2)     otherwise
    step    = (compute ** gamma + sync ** gamma) ** (1 / gamma)

A worker's share of the global batch is at least ``min_local_batch``. With
``gradient_accumulation`` a share above ``max_local_batch`` is computed in
``k = ceil(b / max_local_batch)`` micro-batches of ``b / k``: ``k - 1`` of them compute alone
and the last one overlaps the sync, as tidal's runtime and the Pollux artifact's jobs do.
Without it the global batch is capped at ``max_local_batch`` per worker.

Every function accepts numpy arrays for the worker, node and batch arguments.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields, replace
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from tidal.policy.api import ThroughputModel

FloatArray = npt.NDArray[np.float64]
ArrayLike = npt.ArrayLike

#: Batch sizes tried per worker count when searching for the best one (log-spaced).
BATCH_GRID_POINTS = 32


class StepSample(NamedTuple):
    """One measured configuration: the input of :func:`fit_throughput_model`."""

    workers: int
    nodes: int
    local_batch: float
    step_time: float
    sync_time: float


def step_time(
    model: ThroughputModel, workers: ArrayLike, nodes: ArrayLike, local_batch: ArrayLike
) -> FloatArray:
    """Seconds per optimiser step (see the module docstring)."""
    w = np.asarray(workers, dtype=np.float64)
    n = np.asarray(nodes, dtype=np.float64)
    compute = compute_time(model, local_batch)
    local = model.alpha_sync_local + model.beta_sync_local * (w - 2)
    remote = model.alpha_sync_node + model.beta_sync_node * (w - 2)
    sync = np.where(w <= 1, 0.0, np.where(n <= 1, local, remote))
    sync = np.maximum(sync, 0.0)
    gamma = max(model.gamma, 1.0)
    if gamma == 1.0:
        return np.asarray(compute + sync, dtype=np.float64)
    return np.asarray((compute**gamma + sync**gamma) ** (1.0 / gamma), dtype=np.float64)


def compute_time(model: ThroughputModel, local_batch: ArrayLike) -> FloatArray:
    """Seconds one worker computes a (micro-)batch of ``local_batch``, without the sync."""
    b = np.asarray(local_batch, dtype=np.float64)
    return np.asarray(np.maximum(model.alpha_compute + model.beta_compute * b, 1e-9))


def accumulated_step_time(
    model: ThroughputModel,
    workers: ArrayLike,
    nodes: ArrayLike,
    local_batch: ArrayLike,
    micro_steps: ArrayLike,
) -> FloatArray:
    """Seconds per step when each worker computes its ``local_batch`` in ``micro_steps``
    equal micro-batches: all but the last compute alone, the last overlaps the sync."""
    steps = np.asarray(micro_steps, dtype=np.float64)
    micro = np.asarray(local_batch, dtype=np.float64) / steps
    return np.asarray(
        step_time(model, workers, nodes, micro) + (steps - 1.0) * compute_time(model, micro),
        dtype=np.float64,
    )


def noise_scale(grad_sqr: float, grad_var: float, init_batch: int) -> float:
    """Gradient noise scale (samples) from the gradient statistics at ``init_batch``."""
    if grad_sqr <= 0.0:
        # No signal left: every extra sample is noise averaging, worth as much as a step.
        return float("inf")
    return float(init_batch * max(grad_var, 0.0) / grad_sqr)


def statistical_gain(model: ThroughputModel, global_batch: ArrayLike) -> FloatArray:
    """Initial-batch steps one step at ``global_batch`` is worth (``1`` at the initial batch)."""
    scale = np.asarray(global_batch, dtype=np.float64) / max(model.init_batch_size, 1)
    ratio = model.grad_noise_scale / max(model.init_batch_size, 1)
    if np.isinf(ratio):
        return np.asarray(scale, dtype=np.float64)
    return np.asarray((ratio + 1.0) / (ratio / scale + 1.0), dtype=np.float64)


def goodput(
    model: ThroughputModel, workers: ArrayLike, nodes: ArrayLike, global_batch: ArrayLike
) -> FloatArray:
    """Progress per second for ``workers`` on ``nodes`` at ``global_batch`` (with gradient
    accumulation where the model allows it and one worker's share exceeds its maximum)."""
    w = np.maximum(np.asarray(workers, dtype=np.float64), 1.0)
    batch = np.asarray(global_batch, dtype=np.float64)
    local = batch / w
    micro_steps = (
        np.maximum(1.0, np.ceil(local / max(model.max_local_batch, 1) - 1e-9))
        if model.gradient_accumulation
        else np.ones_like(local)
    )
    seconds = accumulated_step_time(model, w, nodes, local, micro_steps)
    return np.asarray(statistical_gain(model, batch) / seconds, dtype=np.float64)


def _batch_bounds(model: ThroughputModel, workers: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Smallest and largest global batch worth trying for each worker count: from the
    initial batch (at least ``min_local_batch`` a worker) to the largest batch (at most
    ``max_local_batch`` a worker unless gradients accumulate)."""
    high = np.full_like(workers, float(model.max_global_batch))
    if not model.gradient_accumulation:
        high = np.minimum(high, workers * float(model.max_local_batch))
    low = np.maximum(float(max(model.init_batch_size, 1)), workers * float(model.min_local_batch))
    return np.minimum(low, high), high


def best_goodput_table(
    model: ThroughputModel, max_workers: int, slots_per_node: int
) -> tuple[FloatArray, FloatArray]:
    """Best goodput and its global batch for ``0..max_workers`` workers, packed on nodes.

    A job of ``w`` workers is assumed to use ``ceil(w / slots_per_node)`` nodes. Index 0 is
    the job holding nothing (goodput 0).
    """
    if max_workers <= 0:
        return np.zeros(1), np.zeros(1)
    workers = np.arange(1, max_workers + 1, dtype=np.float64)
    nodes = np.ceil(workers / max(slots_per_node, 1))
    low, high = _batch_bounds(model, workers)
    steps = np.linspace(0.0, 1.0, BATCH_GRID_POINTS)
    batches = np.exp(np.log(low)[:, None] + (np.log(high) - np.log(low))[:, None] * steps[None, :])
    values = goodput(model, workers[:, None], nodes[:, None], batches)
    best = np.argmax(values, axis=1)
    rows = np.arange(max_workers)
    table = np.concatenate([[0.0], values[rows, best]])
    chosen = np.concatenate([[0.0], batches[rows, best]])
    return table, chosen


def best_batch(model: ThroughputModel, workers: int, nodes: int) -> tuple[int, float]:
    """The global batch that maximises goodput for ``workers`` on ``nodes``, and that goodput."""
    w = np.array([float(max(workers, 1))])
    low, high = _batch_bounds(model, w)
    steps = np.linspace(0.0, 1.0, BATCH_GRID_POINTS)
    batches = np.exp(np.log(low[0]) + (np.log(high[0]) - np.log(low[0])) * steps)
    # Whole samples per worker: the runtime cannot split a sample.
    batches = np.unique(np.maximum(np.round(batches / w[0]), 1.0) * w[0])
    values = goodput(model, w[0], nodes, batches)
    best = int(np.argmax(values))
    return int(batches[best]), float(values[best])


#: Lower bound of every fitted time parameter (seconds): keeps logs and ratios finite.
FIT_FLOOR = 1e-8

#: Largest overlap exponent: at 10 the p-norm is already close to ``max(compute, sync)``.
MAX_GAMMA = 10.0

#: Regularisation weights: pull ``gamma`` towards 1, where the other terms are easiest to
#: fit, and the retrogression terms towards 0, the optimistic side. Pollux adds 1e-3 and
#: 1e-2 to root-mean-square errors; beside the squared errors fitted here those weights
#: dominate (on exact data the retrogression terms came out at half their true values, and
#: the simulated mean JCT rose 1.6 %), so they are 100 x smaller.
GAMMA_WEIGHT = 1e-5
RETROGRESSION_WEIGHT = 1e-4

#: Parameter order of the fit: compute, across nodes, within a node, overlap (Pollux's).
_ALPHA_C, _BETA_C, _ALPHA_N, _BETA_N, _ALPHA_R, _BETA_R, _GAMMA = range(7)


def fit_throughput_model(
    samples: Sequence[StepSample], template: ThroughputModel
) -> ThroughputModel:
    """Fit the step-time parameters, ``gamma`` included, to measured samples (after Pollux).

    Minimises the squared error of log compute time (``step_time - sync_time`` against the
    per-worker batch) and of log step time (compute and sync combined by the ``gamma``
    p-norm), with a pull of ``gamma`` towards 1 and of the retrogression terms towards 0.
    What the samples cannot tell is fixed the way Pollux fixes it: with one batch size,
    fixed and per-sample compute are half and half; with no one-host multi-worker sample the
    one-host sync is free; with no sample above two workers there is no retrogression; with
    no multi-host sample, sync across hosts costs 1.1 x sync within one (so spreading never
    looks free). Parameters not fitted (batch limits, noise scale) come from ``template``.
    Falls back to a linear fit (``gamma = 1``) if the optimiser fails or scipy is missing;
    with no usable sample the template is returned.
    """
    usable = [
        s
        for s in samples
        if math.isfinite(s.step_time) and s.step_time > 0 and math.isfinite(s.sync_time)
    ]
    if not usable:
        return template
    try:
        params = _fit_log_space(usable)
    except (ImportError, ArithmeticError, ValueError, np.linalg.LinAlgError):
        params = None
    if params is None:
        return _fit_linear(usable, template)
    return replace(
        template,
        alpha_compute=float(params[_ALPHA_C]),
        beta_compute=float(params[_BETA_C]),
        alpha_sync_node=float(params[_ALPHA_N]),
        beta_sync_node=float(params[_BETA_N]),
        alpha_sync_local=float(params[_ALPHA_R]),
        beta_sync_local=float(params[_BETA_R]),
        gamma=float(params[_GAMMA]),
    )


def _log_times(
    params: FloatArray, workers: FloatArray, nodes: FloatArray, batch: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Predicted log compute time and log step time for the parameter vector ``params``."""
    compute = params[_ALPHA_C] + params[_BETA_C] * batch
    across = nodes > 1
    alpha = np.where(across, params[_ALPHA_N], params[_ALPHA_R])
    beta = np.where(across, params[_BETA_N], params[_BETA_R])
    sync = np.where(workers > 1, alpha + beta * np.maximum(workers - 2, 0.0), FIT_FLOOR)
    gamma = params[_GAMMA]
    log_compute = np.log(compute)
    log_step = np.logaddexp(gamma * log_compute, gamma * np.log(sync)) / gamma
    return log_compute, log_step


def _fit_log_space(samples: Sequence[StepSample]) -> FloatArray | None:
    """Pollux's parameter vector fitted to ``samples``, or ``None`` if the fit failed."""
    from scipy.optimize import least_squares  # heavy: only where a model is fitted

    workers = np.array([s.workers for s in samples], dtype=np.float64)
    nodes = np.array([s.nodes for s in samples], dtype=np.float64)
    batch = np.array([s.local_batch for s in samples], dtype=np.float64)
    step = np.array([s.step_time for s in samples], dtype=np.float64)
    # A sync as long as the step (timer noise) would leave no compute; 1 % is kept.
    compute = np.maximum(step - np.clip([s.sync_time for s in samples], 0.0, None), 0.01 * step)
    sync = step - compute

    guess = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0 + 1e-3])
    guess[_ALPHA_C] = float(np.median(compute)) / 2
    guess[_BETA_C] = float(np.median(compute / 2 / np.maximum(batch, 1e-9)))
    spread, local = nodes > 1, (nodes <= 1) & (workers > 1)
    guess[_ALPHA_N] = float(np.median(sync[spread])) if spread.any() else 0.0
    guess[_ALPHA_R] = float(np.median(sync[local])) if local.any() else 0.0
    guess[_BETA_N] = guess[_ALPHA_N] / 16
    guess[_BETA_R] = guess[_ALPHA_R] / 16
    lower = np.full(7, FIT_FLOOR)
    lower[_GAMMA] = 1.0
    upper = np.full(7, np.inf)
    upper[_GAMMA] = MAX_GAMMA
    fixed = np.zeros(7, dtype=bool)
    if len(np.unique(batch)) == 1:
        guess[_ALPHA_C] = float(np.mean(compute)) / 2
        fixed[_ALPHA_C] = True
    if not spread.any():
        fixed[[_ALPHA_N, _BETA_N]] = True
    if not local.any():
        fixed[[_ALPHA_R, _BETA_R]] = True
    if not (workers > 2).any():
        fixed[[_BETA_N, _BETA_R]] = True
    guess[fixed & (np.arange(7) != _ALPHA_C)] = FIT_FLOOR
    guess = np.clip(guess, lower + 1e-12, upper)
    free = ~fixed
    log_compute_measured, log_step_measured = np.log(compute), np.log(step)
    scale = 1.0 / math.sqrt(len(samples))

    def residuals(x: FloatArray) -> FloatArray:
        params = guess.copy()
        params[free] = x
        log_compute, log_step = _log_times(params, workers, nodes, batch)
        regular = [
            math.sqrt(GAMMA_WEIGHT) * (params[_GAMMA] - 1.0),
            math.sqrt(RETROGRESSION_WEIGHT) * params[_BETA_N] / params[_ALPHA_N],
            math.sqrt(RETROGRESSION_WEIGHT) * params[_BETA_R] / params[_ALPHA_R],
        ]
        return np.concatenate(
            [
                scale * (log_compute - log_compute_measured),
                scale * (log_step - log_step_measured),
                regular,
            ]
        )

    params: FloatArray = guess.copy()
    if free.any():
        result = least_squares(
            residuals, guess[free], bounds=(lower[free], upper[free]), x_scale="jac"
        )
        params[free] = result.x
    if not np.all(np.isfinite(params)):
        return None
    if not spread.any():
        # Prior: sync across hosts is dearer than within one (Pollux's 10 %).
        params[_ALPHA_N] = max(params[_ALPHA_N], 1.1 * params[_ALPHA_R])
        params[_BETA_N] = max(params[_BETA_N], 1.1 * params[_BETA_R])
    return params


def _fit_linear(samples: Sequence[StepSample], template: ThroughputModel) -> ThroughputModel:
    """Linear least squares per term (``gamma = 1``): compute on ``step_time - sync_time``
    against the per-worker batch, the sync terms on ``sync_time`` against the worker count,
    separately within one node and across nodes."""

    def line(xs: list[float], ys: list[float]) -> tuple[float, float]:
        if not xs:
            return 0.0, 0.0
        if len(set(xs)) == 1:
            return max(float(np.mean(ys)), 0.0), 0.0
        design = np.column_stack([np.ones(len(xs)), np.asarray(xs)])
        (alpha, beta), *_ = np.linalg.lstsq(design, np.asarray(ys), rcond=None)
        return max(float(alpha), 0.0), max(float(beta), 0.0)

    alpha_c, beta_c = line(
        [s.local_batch for s in samples], [s.step_time - s.sync_time for s in samples]
    )
    local = [s for s in samples if s.nodes == 1 and s.workers > 1]
    remote = [s for s in samples if s.nodes > 1]
    alpha_l, beta_l = line([s.workers - 2.0 for s in local], [s.sync_time for s in local])
    alpha_n, beta_n = line([s.workers - 2.0 for s in remote], [s.sync_time for s in remote])
    if not remote:
        alpha_n, beta_n = 1.1 * alpha_l, 1.1 * beta_l
    return replace(
        template,
        alpha_compute=alpha_c,
        beta_compute=beta_c,
        alpha_sync_local=alpha_l,
        beta_sync_local=beta_l,
        alpha_sync_node=alpha_n,
        beta_sync_node=beta_n,
        gamma=1.0,
    )


def model_to_dict(model: ThroughputModel) -> dict[str, float]:
    """The model as plain JSON-able numbers (what workers report to the controller)."""
    return {name: float(value) for name, value in asdict(model).items()}


def model_from_dict(data: Mapping[str, Any]) -> ThroughputModel:
    """The inverse of :func:`model_to_dict`; unknown keys are ignored, missing ones take the
    defaults. Raises ``ValueError`` on values that are not numbers."""
    kwargs: dict[str, Any] = {}
    for f in fields(ThroughputModel):
        if f.name in data:
            value = float(data[f.name])
            if f.type in ("bool", bool):
                kwargs[f.name] = bool(value)
            else:
                kwargs[f.name] = int(value) if f.type in ("int", int) else value
    try:
        return ThroughputModel(**kwargs)
    except TypeError as exc:  # a required parameter is missing
        raise ValueError(str(exc)) from None
