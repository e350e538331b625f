"""Measured model profiles: step times per placement and gradient statistics per epoch.

A profile folder holds ``placements.csv`` (exact placements of up to four nodes),
``scalability.csv`` (larger configurations, by node and worker count) and one
``validation-<batch>.csv`` per batch size it was trained at (see the traces' README).

``step_time`` in the measurements is the whole optimiser step, ``sync_time`` the part of it
spent synchronising gradients (so ``step_time - sync_time`` is what each gradient
accumulation micro-step costs).
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tidal.policy.api import ThroughputModel
from tidal.policy.goodput_model import FloatArray, StepSample, fit_throughput_model

#: Largest node count with measurements; larger jobs are modelled at this spread.
MAX_MEASURED_NODES = 16

#: Per-GPU batch limits that the measurements alone do not show (memory bounds).
LOCAL_BATCH_LIMITS = {"yolov3": 8}


@dataclass(frozen=True)
class _Curve:
    """Step and sync time against per-worker batch for one configuration."""

    local_batch: FloatArray
    step: FloatArray
    sync: FloatArray

    def at(self, local_batch: float) -> tuple[float, float]:
        """Linear interpolation, clamped to the measured range."""
        return (
            float(np.interp(local_batch, self.local_batch, self.step)),
            float(np.interp(local_batch, self.local_batch, self.sync)),
        )


def _curve(rows: list[tuple[float, float, float]]) -> _Curve:
    """Average repeated measurements of one batch size and sort by batch."""
    grouped: dict[float, list[tuple[float, float]]] = defaultdict(list)
    for batch, step, sync in rows:
        grouped[batch].append((step, sync))
    batches = sorted(grouped)
    return _Curve(
        local_batch=np.array(batches),
        step=np.array([np.mean([s for s, _ in grouped[b]]) for b in batches]),
        sync=np.array([np.mean([y for _, y in grouped[b]]) for b in batches]),
    )


def canonical_placement(placement: tuple[int, ...]) -> tuple[int, ...]:
    """Workers per node with empty nodes removed, as the smallest rotation (the traces' key)."""
    used = tuple(p for p in placement if p > 0)
    if not used:
        return used
    return min(used[i:] + used[:i] for i in range(len(used)))


@dataclass
class ModelProfile:
    """Everything measured about one model."""

    name: str
    init_batch: int
    max_batch: int
    min_local_batch: int
    max_local_batch: int
    #: Progress (initial-batch steps) at the end of each epoch: the least over the runs of
    #: every batch size (so a job is done when any run would have finished its epochs).
    epoch_progress: FloatArray
    #: Gradient statistics during each epoch of the initial-batch run.
    grad_sqr: FloatArray
    grad_var: FloatArray
    placements: dict[tuple[int, ...], _Curve]
    #: (nodes, workers) -> curve, from both files; used for placements not measured exactly.
    by_shape: dict[tuple[int, int], _Curve]
    throughput: ThroughputModel
    #: Batch sizes with a validation run, increasing, and each run's gradient statistics
    #: per epoch (rows follow ``validation_batches``).
    validation_batches: FloatArray = field(default_factory=lambda: np.zeros(0))
    validation_sqr: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))
    validation_var: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))
    #: ``(nodes, workers, local batch, step, sync)`` of every measured shape, for the linear
    #: interpolation over all three of placements not measured exactly.
    shape_points: FloatArray = field(default_factory=lambda: np.zeros((0, 5)))
    _cache: dict[tuple[tuple[int, ...], float], tuple[float, float]] = field(
        default_factory=dict, repr=False
    )
    #: scipy's ``LinearNDInterpolator`` over ``shape_points``, built on first use.
    _interpolator: Any = field(default=None, repr=False)

    @property
    def epochs(self) -> int:
        """Epochs to train (rows of the initial-batch validation run)."""
        return len(self.epoch_progress)

    @property
    def target_progress(self) -> float:
        """Progress at which the job is done."""
        return float(self.epoch_progress[-1])

    def grad_stats(self, progress: float) -> tuple[float, float]:
        """``(grad_sqr, grad_var)`` at ``progress``, interpolated between epochs."""
        return (
            float(np.interp(progress, self.epoch_progress, self.grad_sqr)),
            float(np.interp(progress, self.epoch_progress, self.grad_var)),
        )

    def grad_stats_at(self, batch: float, epoch: int) -> tuple[float, float]:
        """``(grad_sqr, grad_var)`` during ``epoch`` of a run at global ``batch``.

        Linear between the two validated batch sizes around ``batch`` (clamped to the
        validated range): training at a larger batch sees different statistics, and the
        statistical gain must be computed from the ones of the batch the job runs at.
        """
        batches = self.validation_batches
        if len(batches) == 0:
            return self.grad_stats(float(self.epoch_progress[min(epoch, self.epochs - 1)]))
        epoch = min(max(epoch, 0), self.validation_sqr.shape[1] - 1)
        return (
            float(np.interp(batch, batches, self.validation_sqr[:, epoch])),
            float(np.interp(batch, batches, self.validation_var[:, epoch])),
        )

    def step_time(self, placement: tuple[int, ...], local_batch: float) -> tuple[float, float]:
        """``(step_time, sync_time)`` for workers per node ``placement`` at ``local_batch``.

        Exact placements come from ``placements.csv`` (interpolated over the batch only);
        others linearly over (nodes, workers, local batch) among all measured shapes, as the
        Pollux artifact's simulator does; beyond the largest measured node count the largest
        is used. Points outside the measured hull fall back to interpolating node count and
        workers per node separately.
        """
        key = canonical_placement(placement)
        cached = self._cache.get((key, local_batch))
        if cached is not None:
            return cached
        curve = self.placements.get(key)
        if curve is not None:
            result = curve.at(local_batch)
        else:
            nodes = min(len(key), MAX_MEASURED_NODES)
            linear = self._linear(nodes, sum(key), local_batch)
            result = linear or self._by_shape(len(key), sum(key), local_batch)
        self._cache[(key, local_batch)] = result
        return result

    def _linear(self, nodes: int, workers: int, local_batch: float) -> tuple[float, float] | None:
        """Linear interpolation over the measured shapes, ``None`` outside their hull."""
        if len(self.shape_points) < 4:
            return None
        if self._interpolator is None:
            # Imported here: scipy is the simulator's extra, not a core dependency.
            from scipy.interpolate import LinearNDInterpolator

            points = self.shape_points
            self._interpolator = LinearNDInterpolator(points[:, :3], points[:, 3:])
        value = np.asarray(self._interpolator([[nodes, workers, local_batch]]))[0]
        if not np.all(np.isfinite(value)):
            return None
        return float(value[0]), float(value[1])

    def _by_shape(self, nodes: int, workers: int, local_batch: float) -> tuple[float, float]:
        """Interpolate between measured node counts, each at the same workers per node."""
        density = workers / nodes
        node_counts = sorted({n for n, _ in self.by_shape})
        nodes_f = float(min(nodes, MAX_MEASURED_NODES))
        below = max((n for n in node_counts if n <= nodes_f), default=node_counts[0])
        above = min((n for n in node_counts if n >= nodes_f), default=node_counts[-1])

        def at_nodes(n: int) -> tuple[float, float]:
            shapes = sorted(w for m, w in self.by_shape if m == n)
            values = [self.by_shape[(n, w)].at(local_batch) for w in shapes]
            densities = [w / n for w in shapes]
            return (
                float(np.interp(density, densities, [s for s, _ in values])),
                float(np.interp(density, densities, [y for _, y in values])),
            )

        low, high = at_nodes(below), at_nodes(above)
        if above == below:
            return low
        weight = (nodes_f - below) / (above - below)
        return (
            low[0] + weight * (high[0] - low[0]),
            low[1] + weight * (high[1] - low[1]),
        )


def _read_rows(path: Path) -> list[dict[str, str]]:
    """CSV rows as dicts."""
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def load_profile(folder: Path) -> ModelProfile:
    """Read one model's profile folder."""
    name = folder.name
    validation = {
        int(path.stem.split("-")[-1]): _read_rows(path) for path in folder.glob("validation-*.csv")
    }
    if not validation:
        raise FileNotFoundError(f"no validation-*.csv in {folder}")
    init_batch = min(validation)
    runs = validation[init_batch]
    batches = sorted(validation)
    epochs = min(len(validation[b]) for b in batches)

    def column(batch: int, name: str) -> list[float]:
        return [float(r[name]) for r in validation[batch][:epochs]]

    exact: dict[tuple[int, ...], list[tuple[float, float, float]]] = defaultdict(list)
    shapes: dict[tuple[int, int], list[tuple[float, float, float]]] = defaultdict(list)
    samples: list[StepSample] = []
    for row in _read_rows(folder / "placements.csv"):
        placement = tuple(int(d) for d in row["placement"])
        measured = (float(row["local_bsz"]), float(row["step_time"]), float(row["sync_time"]))
        exact[placement].append(measured)
        shapes[(len(placement), sum(placement))].append(measured)
        samples.append(StepSample(sum(placement), len(placement), *measured))
    placed_batches = [s.local_batch for s in samples]
    for row in _read_rows(folder / "scalability.csv"):
        nodes, workers = int(row["num_nodes"]), int(row["num_replicas"])
        measured = (float(row["local_bsz"]), float(row["step_time"]), float(row["sync_time"]))
        shapes[(nodes, workers)].append(measured)
        samples.append(StepSample(workers, nodes, *measured))

    # Repeated measurements of one (nodes, workers, batch) point are averaged.
    grouped: dict[tuple[int, int, float], list[tuple[float, float]]] = defaultdict(list)
    for sample in samples:
        point = (sample.nodes, sample.workers, sample.local_batch)
        grouped[point].append((sample.step_time, sample.sync_time))
    shape_points = np.array(
        [
            (*point, np.mean([v[0] for v in values]), np.mean([v[1] for v in values]))
            for point, values in sorted(grouped.items())
        ]
    )
    # Per-GPU batch bounds are those of the exact placements (as in the artifact).
    max_local = min(int(max(placed_batches)), LOCAL_BATCH_LIMITS.get(name, 1 << 30))
    # Jobs accumulate gradients beyond the largest per-GPU batch, as tidal's runtime and
    # the artifact's adaptive jobs do, and never go below the smallest profiled one.
    template = ThroughputModel.unfitted(
        init_batch_size=init_batch,
        max_local_batch=max_local,
        max_global_batch=max(validation),
        min_local_batch=math.floor(min(placed_batches)),
        gradient_accumulation=True,
    )
    return ModelProfile(
        name=name,
        init_batch=init_batch,
        max_batch=max(validation),
        min_local_batch=math.floor(min(placed_batches)),
        max_local_batch=max_local,
        epoch_progress=np.min([column(b, "progress") for b in batches], axis=0),
        grad_sqr=np.array([float(r["grad_sqr"]) for r in runs[:epochs]]),
        grad_var=np.array([float(r["grad_var"]) for r in runs[:epochs]]),
        placements={p: _curve(rows) for p, rows in exact.items()},
        by_shape={s: _curve(rows) for s, rows in shapes.items()},
        throughput=fit_throughput_model(samples, template),
        validation_batches=np.array(batches, dtype=np.float64),
        validation_sqr=np.array([column(b, "grad_sqr") for b in batches]),
        validation_var=np.array([column(b, "grad_var") for b in batches]),
        shape_points=shape_points,
    )


def load_profiles(folder: Path) -> dict[str, ModelProfile]:
    """Every model profile under ``folder`` (one sub-folder per model)."""
    profiles = {
        sub.name: load_profile(sub)
        for sub in sorted(folder.iterdir())
        if sub.is_dir() and (sub / "placements.csv").exists()
    }
    if not profiles:
        raise FileNotFoundError(f"no model profiles under {folder}")
    return profiles
