"""The tasks of ``benchmarks/tta_sweep.py``, and the modelled step time of each.

Three offline tasks, each small enough that one configuration reaches its target in a
few seconds of CPU:

* ``digits``: scikit-learn's bundled digits (``examples/digits_mlp.py``'s split), an MLP
  64 → 128 → 10; the gradient noise is small, so small batches are efficient.
* ``teacher``: ``examples/synthetic_mlp.py``'s seeded inputs labelled by a random linear
  teacher (16,384 training, 4,096 held-out samples), its 2-layer MLP at 5·10⁴ parameters.
* ``images``: a small CNN on synthetic 12 × 12 images, each class a fixed random pattern
  under heavy pixel noise. Chosen because batch size matters more there: the noise makes
  the gradient noise scale large (thousands of samples), so large batches keep their
  statistical efficiency, and the convolutions make a step's fixed cost a larger share.

Time is modelled, not read from the clock (the machine is shared and loaded): a step on
``W`` replicas with ``b = B / W`` samples each, in ``m`` micro-batches of at most ``hi``,
takes ``m · alpha + beta · b + sync(W)``, with ``alpha`` and ``beta`` fitted once per
task to timed forward-backward passes (:func:`calibrate`) and ``sync(W)`` the ring
all-reduce of the gradient at :data:`LINK_BYTES_PER_S` plus :data:`SYNC_LATENCY` per hop.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from digits_mlp import build_data as digits_data
from synthetic_mlp import build_data as teacher_data
from synthetic_mlp import build_model as teacher_model

#: Bandwidth of the modelled all-reduce (bytes/s) and its latency per ring hop (s).
LINK_BYTES_PER_S = 1e9
SYNC_LATENCY = 2e-4


@dataclass
class Task:
    """One task: its data, model, target and batch grid."""

    name: str
    train: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]
    build: Callable[[int], nn.Module]
    target: float
    fixed: tuple[int, ...]
    max_epochs: int
    #: Held-out accuracy is checked every this many training samples (any batch).
    eval_samples: int = 1024
    alpha: float = 0.0
    beta: float = 0.0
    params: int = 0

    def sync_time(self, workers: int) -> float:
        """Modelled all-reduce time of one step's gradient on ``workers``."""
        if workers <= 1:
            return 0.0
        volume = 2.0 * (workers - 1) / workers * 4 * self.params
        return volume / LINK_BYTES_PER_S + 2 * (workers - 1) * SYNC_LATENCY

    def step_time(self, workers: int, batch: int, max_local: int) -> tuple[float, float]:
        """Modelled ``(step time, sync time)`` of global ``batch`` on ``workers``."""
        local = batch / workers
        micro = max(1, math.ceil(local / max_local))
        sync = self.sync_time(workers)
        return micro * self.alpha + self.beta * local + sync, sync


def _digits() -> Task:
    train, test = digits_data(0)

    def build(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

    # 1,437 training samples: checked every 256, or the best runs' few epochs would be
    # measured to the nearest 0.7 epoch.
    fixed = (8, 16, 32, 64, 128)
    (x, y), (x_test, y_test) = train.tensors, test.tensors
    return Task("digits", (x, y), (x_test, y_test), build, 0.96, fixed, 40, 256)


def _teacher() -> Task:
    x, y = teacher_data(20_480, 0).tensors

    def build(seed: int) -> nn.Module:
        model: nn.Module = teacher_model(5e4, 2, seed)
        return model

    return Task(
        "teacher",
        (x[:16384], y[:16384]),
        (x[16384:], y[16384:]),
        build,
        0.80,
        (32, 64, 128, 256, 512),
        12,
    )


def _images(train_n: int = 8192, test_n: int = 2048, side: int = 12) -> Task:
    g = torch.Generator().manual_seed(1)
    patterns = torch.randn(10, 1, side, side, generator=g)
    labels = torch.randint(0, 10, (train_n + test_n,), generator=g)
    x = patterns[labels] + 2.5 * torch.randn(train_n + test_n, 1, side, side, generator=g)

    def build(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(16 * (side // 4) ** 2, 10),
        )

    return Task(
        "images",
        (x[:train_n], labels[:train_n]),
        (x[train_n:], labels[train_n:]),
        build,
        0.80,
        (32, 64, 128, 256, 512),
        12,
    )


TASKS: dict[str, Callable[[], Task]] = {
    "digits": _digits,
    "teacher": _teacher,
    "images": _images,
}


def calibrate(task: Task, sizes: tuple[int, ...] = (8, 32, 128), repeats: int = 7) -> None:
    """Fit ``alpha + beta · b`` to the median time of forward-backward passes at each
    local batch ``b`` (least squares over the sizes)."""
    model = task.build(0)
    loss_fn = nn.CrossEntropyLoss()
    x, y = task.train
    task.params = sum(p.numel() for p in model.parameters())
    points = []
    for b in sizes:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model.zero_grad()
            loss_fn(model(x[:b]), y[:b]).backward()
            times.append(time.perf_counter() - start)
        points.append((b, statistics.median(times)))
    mean_b = statistics.fmean(b for b, _ in points)
    mean_t = statistics.fmean(t for _, t in points)
    cov = sum((b - mean_b) * (t - mean_t) for b, t in points)
    var = sum((b - mean_b) ** 2 for b, _ in points)
    task.beta = max(cov / var, 1e-9)
    task.alpha = max(mean_t - task.beta * mean_b, 1e-6)
