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
    #: Progress (initial-batch steps) at the end of each epoch, from the initial-batch run.
    epoch_progress: FloatArray
    grad_sqr: FloatArray
    grad_var: FloatArray
    placements: dict[tuple[int, ...], _Curve]
    #: (nodes, workers) -> curve, from both files; used for placements not measured exactly.
    by_shape: dict[tuple[int, int], _Curve]
    throughput: ThroughputModel
    _cache: dict[tuple[tuple[int, ...], float], tuple[float, float]] = field(
        default_factory=dict, repr=False
    )

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

    def step_time(self, placement: tuple[int, ...], local_batch: float) -> tuple[float, float]:
        """``(step_time, sync_time)`` for workers per node ``placement`` at ``local_batch``.

        Exact placements come from ``placements.csv`` (interpolated over the batch only);
        others are interpolated over node count and workers per node among all measured
        shapes; beyond the largest measured node count the largest is used.
        """
        key = canonical_placement(placement)
        cached = self._cache.get((key, local_batch))
        if cached is not None:
            return cached
        curve = self.placements.get(key) or self.placements.get(tuple(sorted(key)))
        if curve is not None:
            result = curve.at(local_batch)
        else:
            result = self._by_shape(len(key), sum(key), local_batch)
        self._cache[(key, local_batch)] = result
        return result

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

    exact: dict[tuple[int, ...], list[tuple[float, float, float]]] = defaultdict(list)
    shapes: dict[tuple[int, int], list[tuple[float, float, float]]] = defaultdict(list)
    samples: list[StepSample] = []
    for row in _read_rows(folder / "placements.csv"):
        placement = tuple(int(d) for d in row["placement"])
        measured = (float(row["local_bsz"]), float(row["step_time"]), float(row["sync_time"]))
        exact[placement].append(measured)
        shapes[(len(placement), sum(placement))].append(measured)
        samples.append(StepSample(sum(placement), len(placement), *measured))
    for row in _read_rows(folder / "scalability.csv"):
        nodes, workers = int(row["num_nodes"]), int(row["num_replicas"])
        measured = (float(row["local_bsz"]), float(row["step_time"]), float(row["sync_time"]))
        shapes[(nodes, workers)].append(measured)
        samples.append(StepSample(workers, nodes, *measured))

    local_batches = [s.local_batch for s in samples]
    max_local = min(int(max(local_batches)), LOCAL_BATCH_LIMITS.get(name, 1 << 30))
    template = ThroughputModel(
        alpha_compute=0.0,
        beta_compute=0.0,
        alpha_sync_local=0.0,
        beta_sync_local=0.0,
        alpha_sync_node=0.0,
        beta_sync_node=0.0,
        init_batch_size=init_batch,
        max_local_batch=max_local,
        max_global_batch=max(validation),
    )
    return ModelProfile(
        name=name,
        init_batch=init_batch,
        max_batch=max(validation),
        min_local_batch=math.floor(min(local_batches)),
        max_local_batch=max_local,
        epoch_progress=np.array([float(r["progress"]) for r in runs]),
        grad_sqr=np.array([float(r["grad_sqr"]) for r in runs]),
        grad_var=np.array([float(r["grad_var"]) for r in runs]),
        placements={p: _curve(rows) for p, rows in exact.items()},
        by_shape={s: _curve(rows) for s, rows in shapes.items()},
        throughput=fit_throughput_model(samples, template),
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
