"""The gradient noise scale, measured from the gradients the gradient hook already sees.

The **gradient noise scale** ``B_noise = tr(Σ) / |G|²`` (McCandlish et al. 2018) says how
large a batch still pays: well below it, doubling the batch nearly halves the steps needed;
well above it, extra samples are wasted. It is estimated without a collective of its own:
the gradient hook holds each rank's gradient before the all-reduce (a mean over its ``b_r``
samples) and the reduced one after it (a mean over the global ``B``), and
``E|g_b|² = |G|² + tr(Σ)/b``. :class:`GradientRecorder` takes one dot product per bucket
and side; :class:`NoiseScaleEstimator` turns pairs of squared norms into smoothed
``|G|²`` and ``tr(Σ)``. Alone (world 1) the two gradients are those of two successive
steps. :func:`adascale_gain` is what a step at a larger batch is worth, given that noise
scale (AdaScale). :class:`tidal.runtime.adaptive.AdaptiveBatch` drives all three.
"""

from __future__ import annotations

import math
import threading
import time

import torch

from tidal.runtime.context import WorkerContext

#: Smoothing of the gradient statistics (effective window ~ (1 + s) / (1 - s) steps).
NOISE_SMOOTHING = 0.98
#: Gradient samples before the noise scale can decide the batch, if its relative standard
#: error is within MAX_NOISE_ERROR by then; after TRUSTED_NOISE_SAMPLES (about the
#: smoothing's time constant) it decides whatever its spread.
MIN_NOISE_SAMPLES = 3
MAX_NOISE_ERROR = 0.5
TRUSTED_NOISE_SAMPLES = 50


class NoiseScaleEstimator:
    """Smoothed estimates of ``|G|²`` and ``tr(Σ)`` (per-sample gradient covariance).

    Each :meth:`update` takes the squared norm of a gradient averaged over ``small``
    samples and of one averaged over ``big`` samples of the same step (the second
    containing the first, or independent of it: both are unbiased). Numerator and
    denominator are averaged separately (bias-corrected, like Adam's moments), then
    divided: the ratio of two noisy means is far more stable than the mean of ratios.
    """

    def __init__(self, smoothing: float = NOISE_SMOOTHING) -> None:
        self.smoothing = smoothing
        self.sqr = 0.0
        self.var = 0.0
        self.weight = 0.0
        self.count = 0
        # Smoothed squares of the per-step values and the sum of squared weights: the
        # spread of the averages (their standard errors) comes from these.
        self.sqr_sq = 0.0
        self.var_sq = 0.0
        self.weight_sq = 0.0

    def update(self, small_sqr: float, small: float, big_sqr: float, big: float) -> None:
        """Add one step's pair of squared norms (batches ``small < big``)."""
        if not big > small > 0 or not (math.isfinite(small_sqr) and math.isfinite(big_sqr)):
            return
        grad_sqr = (big * big_sqr - small * small_sqr) / (big - small)
        trace = (small_sqr - big_sqr) / (1.0 / small - 1.0 / big)
        s = self.smoothing
        self.sqr = s * self.sqr + (1 - s) * grad_sqr
        self.var = s * self.var + (1 - s) * trace
        self.weight = s * self.weight + (1 - s)
        self.sqr_sq = s * self.sqr_sq + (1 - s) * grad_sqr * grad_sqr
        self.var_sq = s * self.var_sq + (1 - s) * trace * trace
        self.weight_sq = s * s * self.weight_sq + (1 - s) ** 2
        self.count += 1

    @property
    def grad_sqr(self) -> float:
        """Smoothed ``|G|²``."""
        return self.sqr / self.weight if self.weight > 0 else 0.0

    @property
    def grad_var(self) -> float:
        """Smoothed ``tr(Σ)``, the per-sample gradient variance."""
        return self.var / self.weight if self.weight > 0 else 0.0

    @property
    def noise_scale(self) -> float:
        """``tr(Σ) / |G|²`` in samples; ``inf`` when no signal is left, 0 before data."""
        if self.weight <= 0:
            return 0.0
        if self.grad_sqr <= 0:
            return math.inf
        return max(self.grad_var, 0.0) / self.grad_sqr

    @property
    def relative_error(self) -> float:
        """Relative standard error of :attr:`noise_scale`, from the spread of the per-step
        values around their averages (``inf`` before two samples or without signal).
        Both averages' errors add in quadrature (the ratio's first-order error)."""
        if self.count < 2 or self.weight <= 0 or self.weight_sq <= 0:
            return math.inf
        effective = self.weight**2 / self.weight_sq  # samples the weighted mean is worth
        if effective <= 1.0:
            return math.inf
        errors = []
        for mean_sq, mean in ((self.sqr_sq, self.grad_sqr), (self.var_sq, self.grad_var)):
            if mean <= 0:
                return math.inf
            spread = max(mean_sq / self.weight - mean * mean, 0.0) * effective / (effective - 1)
            errors.append(spread / effective / (mean * mean))
        return math.sqrt(sum(errors))

    def state_dict(self) -> dict[str, float]:
        """Plain numbers."""
        return {
            "sqr": self.sqr,
            "var": self.var,
            "weight": self.weight,
            "count": self.count,
            "sqr_sq": self.sqr_sq,
            "var_sq": self.var_sq,
            "weight_sq": self.weight_sq,
        }

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Adopt :meth:`state_dict` (one without the spread reads as spread unknown)."""
        self.sqr = float(state["sqr"])
        self.var = float(state["var"])
        self.weight = float(state["weight"])
        self.count = int(state["count"])
        self.sqr_sq = float(state.get("sqr_sq", 0.0))
        self.var_sq = float(state.get("var_sq", 0.0))
        self.weight_sq = float(state.get("weight_sq", 0.0))


def estimate_trusted(count: int, relative_error: float) -> bool:
    """Whether a noise estimate of ``count`` samples, with that relative standard error
    (:attr:`NoiseScaleEstimator.relative_error`), may choose the batch: from
    :data:`MIN_NOISE_SAMPLES` once its error is within :data:`MAX_NOISE_ERROR`, and from
    :data:`TRUSTED_NOISE_SAMPLES` on whatever its spread. The gain that sets the learning
    rate comes from the same estimate, so an estimate too noisy to trust (a first few
    steps' ratio several times off) neither picks a batch nor scales the rate."""
    if count >= TRUSTED_NOISE_SAMPLES:
        return True
    return count >= MIN_NOISE_SAMPLES and relative_error <= MAX_NOISE_ERROR


def adascale_gain(noise_scale: float, init_batch: int, batch: float) -> float:
    """Initial-batch steps one step at ``batch`` is worth: ``(var + sqr) / (var / scale +
    sqr)`` with ``scale = batch / init_batch``; 1 at the initial batch, within
    ``[1, scale]`` above it (``[scale, 1]`` below)."""
    scale = batch / max(init_batch, 1)
    ratio = noise_scale / max(init_batch, 1)
    gain = scale if math.isinf(ratio) else (ratio + 1.0) / (ratio / scale + 1.0)
    low, high = min(1.0, scale), max(1.0, scale)
    return min(max(gain, low), high)


class GradientRecorder:
    """What the gradient hook measures in one step (see :mod:`tidal.runtime.parallel`).

    ``before`` runs on the bucket as the hook receives it (this rank's gradient, before
    weighting and all-reduce); ``after`` on the reduced bucket, on the communication
    thread. Each adds one dot product per bucket, kept as a tensor: on a GPU, reading it
    in the hook would stall the backward pass. :meth:`totals_async` sums them on the device
    and starts their copy to host memory, read once it has arrived (:class:`HostReading`):
    the host never waits for the GPU.
    """

    def __init__(self, context: WorkerContext) -> None:
        self.context = context
        self._lock = threading.Lock()
        self._local: list[torch.Tensor] = []
        self._global: list[torch.Tensor] = []
        self._cross: list[torch.Tensor] = []
        self.last_hook = 0.0
        self.last_done = 0.0
        # Alone: the previous step's gradient per bucket, and its squared norm.
        self._previous: dict[int, torch.Tensor] = {}
        self.previous_sqr = 0.0
        self.paired = True

    def reset(self) -> None:
        """Start a new step."""
        with self._lock:
            self._local, self._global, self._cross = [], [], []
            self.paired = True
            self.last_hook = self.last_done = 0.0

    def forget_previous(self) -> None:
        """Drop the previous step's gradient (the world or the batch changed)."""
        self._previous.clear()
        self.previous_sqr = 0.0

    def before(self, index: int, tensor: torch.Tensor) -> None:
        """This rank's own gradient of one bucket."""
        flat = tensor.detach().reshape(-1)
        sqr = torch.dot(flat, flat)
        cross = None
        if self.context.world_size == 1:
            previous = self._previous.get(index)
            if previous is not None and previous.shape == flat.shape:
                cross = torch.dot(previous, flat)
                previous.copy_(flat)
            else:
                self._previous[index] = flat.clone()
        with self._lock:
            self._local.append(sqr)
            self.last_hook = time.perf_counter()
            if cross is None:
                self.paired = False
            else:
                self._cross.append(cross)

    def after(self, tensor: torch.Tensor) -> torch.Tensor:
        """The reduced gradient of one bucket (returned unchanged)."""
        flat = tensor.detach().reshape(-1)
        sqr = torch.dot(flat, flat)
        with self._lock:
            self._global.append(sqr)
            self.last_done = time.perf_counter()
        return tensor

    def totals_async(self) -> HostReading:
        """This step's squared norms, on their way to host memory: local, global (reduced),
        and the cross term with the previous step's gradient (alone)."""
        with self._lock:
            groups = (self._local, self._global, self._cross)
            sums = [torch.stack(parts).sum() for parts in groups if parts]
        if len(sums) < len(groups):
            device = sums[0].device if sums else torch.device("cpu")
            zero = torch.zeros((), dtype=torch.float32, device=device)
            sums = [torch.stack(parts).sum() if parts else zero for parts in groups]
        return HostReading(torch.stack([s.to(torch.float64) for s in sums]))

    @property
    def sync_time(self) -> float:
        """Communication not hidden behind the backward pass: from the last bucket being
        ready to the last all-reduce being done (when the host saw them)."""
        return max(0.0, self.last_done - self.last_hook) if self.last_done else 0.0


class HostReading:
    """Device values copied to host memory without blocking the host: the copy goes to
    pinned memory behind the GPU's queued work, and :meth:`ready` says (without waiting)
    whether it has landed. CPU tensors are ready at once."""

    def __init__(self, values: torch.Tensor) -> None:
        self._event: torch.cuda.Event | None = None
        if values.device.type == "cuda":
            host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            host.copy_(values, non_blocking=True)
            self._event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._event.record()
            values = host
        self._host = values

    def ready(self) -> bool:
        """Whether :meth:`values` can be read without waiting for the device."""
        return self._event is None or bool(self._event.query())  # type: ignore[no-untyped-call]

    def values(self) -> tuple[float, float, float]:
        """The three values (waits for the copy if it has not landed yet)."""
        if self._event is not None:
            self._event.synchronize()
        local, global_, cross = self._host.tolist()
        return float(local), float(global_), float(cross)
