"""What rank 0 reports of its adaptive batch: fitted model, noise scale, batch, speed-up.

A pure function of the adaptive batch's measurements (the launcher forwards the report to
the controller, whose goodput policy plans with it; the dashboard shows it).
:meth:`tidal.runtime.adaptive.AdaptiveBatch.report` gathers the inputs.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from tidal.policy.api import ThroughputModel
from tidal.policy.goodput_model import model_to_dict, statistical_gain
from tidal.runtime import batch_choice
from tidal.runtime.batch_choice import BatchLimits
from tidal.runtime.gradient_noise import NoiseScaleEstimator


@dataclass(frozen=True)
class BatchReading:
    """Where the adaptive batch stands: its world, batch, measured step times there
    (``(seconds, sync seconds)`` pairs), noise estimate, progress, step, and whether it
    is ready to decide."""

    world: int
    batch: int
    times: list[tuple[float, float]]
    noise: NoiseScaleEstimator
    progress: float
    step: int
    ready: bool


def goodput_report(
    model: ThroughputModel, limits: BatchLimits, reading: BatchReading
) -> dict[str, Any]:
    """The goodput report (plain JSON): fitted model, noise scale, batch, efficiency,
    predicted speed-up over one worker at the initial batch, measured step time."""
    world, batch, times = reading.world, reading.batch, reading.times
    gain = float(statistical_gain(model, batch))
    base = batch_choice.predicted_goodput(model, limits, 1, limits.init_batch)
    here = batch_choice.predicted_goodput(model, limits, world, batch)
    measured = statistics.median(t for t, _ in times) if times else None
    fitted = model_to_dict(model)
    # JSON has no infinity: "no signal left" is sent as a very large noise scale.
    fitted["grad_noise_scale"] = min(fitted["grad_noise_scale"], 1e30)
    noise = reading.noise.noise_scale
    return {
        "model": fitted,
        "batch_size": batch,
        "workers": world,
        "local_batch": batch / max(world, 1),
        "accumulation": batch_choice.accumulation_steps(limits, batch / max(world, 1)),
        "noise_scale": noise if math.isfinite(noise) else None,
        "noise_samples": reading.noise.count,
        "gain": gain,
        "efficiency": gain * limits.init_batch / batch,
        "speedup": here / base if base > 0 else None,
        "step_time": measured,
        "samples_per_s": batch / measured if measured else None,
        "progress": reading.progress,
        "step": reading.step,
        "ready": reading.ready,
    }
