"""Adaptive batch size, after AdaptDL/Pollux (OSDI'21).

How fast a job trains depends on its batch size as much as on its worker count: a small
batch wastes the workers (each step pays the gradient sync for few samples), a large one
wastes samples (each sample moves the model less: lower statistical efficiency). With
``loader.autoscale_batch_size(max_global)`` the runtime picks the global batch that
maximises *goodput* = throughput x statistical efficiency for the current world, from

* a **throughput model** (:mod:`tidal.policy.goodput_model`, the Pollux form): the step
  time as ``compute(per-worker batch) + sync(workers)``, fitted to step times measured at
  each configuration the job ran in (median of the recent steps of each);
* the **gradient noise scale** ``B_noise = tr(Σ) / |G|²`` (McCandlish et al. 2018), from
  the squared gradient norms the gradient hook measures before and after the all-reduce
  (:mod:`tidal.runtime.gradient_noise`). Each rank's local norm rides in its own slot of
  the agreement all-reduce (a MAX: the other ranks put 0 there), so every rank sees all of
  them one step later and keeps the same estimate, without a collective of its own.

:class:`AdaptiveBatch` gathers both and applies the choice; the choice itself is a pure
function of them (:mod:`tidal.runtime.batch_choice`). Decisions are made on rank 0 only
and carried to the others inside the agreement collective every rank already runs at the
step boundary (:class:`tidal.State`), so all ranks switch to the new batch at the same
step. The batch is re-chosen when the world changes, and at epoch boundaries and every
:data:`RECHOOSE_STEPS` steps when the predicted goodput gain exceeds
:data:`~tidal.runtime.batch_choice.RECHOOSE_GAIN` (5%); a choice made on a young noise
estimate is looked at again sooner (:func:`~tidal.runtime.batch_choice.steps_to_next_look`).
Everything here is part of the loader's state: it travels to newcomers, is rolled back
with a failed step, and is saved in durable checkpoints.

The learning rate follows the batch through :func:`tidal.runtime.lr_scaling.adaptive_lr`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from tidal.policy.api import ThroughputModel
from tidal.runtime import batch_choice
from tidal.runtime.batch_choice import BatchLimits, Configuration, Profile
from tidal.runtime.context import WorkerContext
from tidal.runtime.goodput_report import BatchReading, goodput_report
from tidal.runtime.gradient_noise import (
    GradientRecorder,
    HostReading,
    NoiseScaleEstimator,
    adascale_gain,
    estimate_trusted,
)
from tidal.runtime.report import reporter

log = logging.getLogger("tidal.runtime")

#: Step-time samples needed at the current configuration before a decision.
MIN_TIMING_SAMPLES = 3
#: Recent step times kept per configuration (their median is the configuration's time).
TIMING_WINDOW = 16
#: Seconds between goodput reports to the launcher (rank 0).
REPORT_INTERVAL = 2.0
#: Steps' gradient norms kept while they travel from the device (older ones are dropped).
_MAX_READINGS = 4
#: Steps after which the batch is looked at again without an epoch boundary (as at one:
#: moved only for RECHOOSE_GAIN): about the noise estimate's time constant
#: (1 / (1 - NOISE_SMOOTHING)), so each look sees a largely new estimate. An epoch of
#: hundreds of steps no longer holds a batch chosen from the first few steps' noise.
RECHOOSE_STEPS = 50
#: Steps over which the learning rate moves from the old batch's to the new one's after a
#: batch change (:func:`tidal.runtime.lr_scaling.current_factor`). Off by default: in
#: ``benchmarks/tta_sweep.py`` a 10-step warm-up gained nothing (digits the same, teacher
#: 9 % slower; docs/benchmarks.md, "Time to accuracy, tuned").
WARMUP_STEPS = 0


class AdaptiveBatch:
    """The adaptive batch size of one :class:`~tidal.runtime.data.ElasticDataLoader`.

    Create it with ``loader.autoscale_batch_size(...)``; the loader and :class:`tidal.State`
    drive it. ``init_batch`` is the loader's batch when autoscaling was switched on.
    """

    def __init__(
        self,
        loader: Any,
        context: WorkerContext,
        max_global: int,
        local_bounds: tuple[int, int],
        gradient_accumulation: bool,
    ) -> None:
        lo, hi = local_bounds
        if not 1 <= lo <= hi:
            raise ValueError(f"local_bounds: expected 1 <= lo <= hi, got {local_bounds!r}")
        if max_global < loader.batch_size:
            raise ValueError(
                f"max_global: expected >= the loader's batch size {loader.batch_size}, "
                f"got {max_global}"
            )
        self.loader = loader
        self.context = context
        self.init_batch = int(loader.batch_size)
        self.max_global = int(max_global)
        self.local_bounds = (int(lo), int(hi))
        self.gradient_accumulation = gradient_accumulation
        self.noise = NoiseScaleEstimator()
        #: ``(workers, nodes, local batch, accumulation steps)`` -> recent step and sync times.
        self.profile: Profile = {}
        #: Training progress in steps at the initial batch (the sum of the gains).
        self.progress = 0.0
        #: Steps of learning-rate warm-up after a batch change (0: the new rate at once).
        self.warmup_steps = WARMUP_STEPS
        #: The batch before the last change, and the steps taken since that change.
        self.previous_batch: int | None = None
        self.steps_since_change = 0
        self.recorder = GradientRecorder(context)
        self._attached = False
        # Why the batch should be looked at again: "world", "epoch" or None.
        self._pending: str | None = "world"
        self._since_look = 0
        self._look_after = RECHOOSE_STEPS
        self._last_end: float | None = None
        self._local = 0
        self._global = 0
        self._last_report = 0.0
        self._gain_cache: tuple[int, int, float] | None = None
        # (local sqr, global sqr, batch, world) of the last step, and of the one whose
        # norms are in the agreement in flight.
        self._step_stats: tuple[float, float, int, int] | None = None
        self._sent: tuple[float, float, int, int] | None = None
        # Gradient norms on their way from the device, with (local batch, global batch,
        # world, paired) of their step, oldest first.
        self._readings: list[tuple[HostReading, int, int, int, bool]] = []
        if gradient_accumulation:
            loader.micro_batch_size = hi

    # -- what the loader and the state call -----------------------------------------------

    def note_batch(self, local: int, global_: int) -> None:
        """The step about to run: this rank computes ``local`` of ``global_`` samples."""
        if not self._attached and self.context.parallel is not None:
            self.context.parallel.set_recorder(self.recorder)
            self._attached = True
        self._local, self._global = local, global_
        self.recorder.reset()

    def end_step(self, timing: tuple[float, float] | None = None) -> None:
        """A step committed: record its time and gradient statistics (every rank).

        ``timing``: the step's ``(seconds, exposed sync seconds)`` where they come from
        elsewhere than this process's clock (a simulator replaying a throughput model);
        by default the time since the previous step's end and the hook's sync time."""
        now = time.perf_counter()
        world = self.context.world_size
        recorder = self.recorder
        self._step_stats = None
        if self._global > 0:
            self.progress += self.gain()
            self.steps_since_change += 1
            self._since_look += 1
            if self._pending is None and self._since_look >= self._look_after:
                self._pending = "epoch"
            reading = recorder.totals_async()
            self._readings.append((reading, self._local, self._global, world, recorder.paired))
            # On a GPU the norms arrive a step or so later; never wait for them (a host
            # synchronisation per step). On a CPU they are there at once.
            while self._readings and self._readings[0][0].ready():
                self._take(*self._readings.pop(0))
            del self._readings[:-_MAX_READINGS]
            if timing is None and self._last_end is not None:
                timing = (now - self._last_end, recorder.sync_time)
            if timing is not None:
                key = self._config(world, self.loader.batch_size)
                times = self.profile.setdefault(key, [])
                times.append(timing)
                del times[:-TIMING_WINDOW]
        self._last_end = now
        if (
            self.context.rank == 0
            and now - self._last_report >= REPORT_INTERVAL
            and self.measured()
        ):
            self._last_report = now
            self._report()

    def _take(
        self, reading: HostReading, local: int, global_: int, world: int, paired: bool
    ) -> None:
        """Use one step's gradient norms, now in host memory."""
        recorder = self.recorder
        local_sqr, global_sqr, cross = reading.values()
        if world > 1 and global_sqr > 0 and local < global_:
            # Completed when the agreement brings every rank's local norm (absorb()).
            self._step_stats = (local_sqr, global_sqr, global_, world)
        elif world == 1 and paired and recorder.previous_sqr > 0:
            # Two successive steps of the same batch as two "workers".
            small = (recorder.previous_sqr + local_sqr) / 2
            big = (recorder.previous_sqr + local_sqr + 2 * cross) / 4
            self.noise.update(small, global_, big, 2 * global_)
        if world == 1:
            recorder.previous_sqr = local_sqr

    def agreement_values(self) -> list[float]:
        """What this rank adds to the agreement all-reduce (a MAX): rank 0's batch decision
        (0 elsewhere, or no change), then one slot per rank holding that rank's squared
        local gradient norm of this step (0 in the others' slots)."""
        context = self.context
        world = context.world_size
        slots = [0.0] * world if world > 1 else []
        self._sent = self._step_stats if world > 1 else None
        if self._sent is not None:
            slots[context.rank] = self._sent[0]
        proposal = float(self.proposal()) if context.rank == 0 else 0.0
        return [proposal, *slots]

    def absorb(self, values: Sequence[float]) -> None:
        """The agreement's result (after :meth:`agreement_values`): every rank's local norm
        of that step completes its statistics; a batch decision takes effect now."""
        proposal, norms = int(values[0]), values[1:]
        sent, self._sent = self._sent, None
        if sent is not None and len(norms) == sent[3] and all(n > 0 for n in norms):
            _, global_sqr, batch, world = sent
            base, extra = divmod(batch, world)
            # Ranks hold base or base + 1 samples: E mean|g_r|² = |G|² + tr(Σ) mean(1 / b_r).
            inverse = (extra / (base + 1) + (world - extra) / base) / world
            self.noise.update(sum(norms) / world, 1.0 / inverse, global_sqr, batch)
        if proposal > 0:
            self.apply(proposal)

    def on_generation(self) -> None:
        """The world changed: re-choose the batch for it (at the next step boundary from
        the fitted model, or once the first configuration is timed)."""
        self._pending = "world"
        self._last_end = None
        self._step_stats = self._sent = None
        self._readings.clear()
        self.recorder.forget_previous()

    def on_epoch(self) -> None:
        """An epoch starts: re-choose if it pays enough."""
        if self._pending is None:
            self._pending = "epoch"
        self._last_end = None

    def proposal(self) -> int:
        """Rank 0's decision to carry in the agreement: a new global batch, or 0."""
        if self._pending is None or not self.ready():
            return 0
        reason, self._pending = self._pending, None
        self._since_look = 0
        self._look_after = batch_choice.steps_to_next_look(self.noise.count, RECHOOSE_STEPS)
        if not self._timed():
            # A new world, decided on the model fitted to the worlds before it (alone
            # there is no sync; more workers extrapolate it) rather than after steps at a
            # batch chosen for another world: a batch sized for 4 workers' sync costs a
            # lone worker several times a suitable step. Looked at again once measured.
            self._look_after = MIN_TIMING_SAMPLES
        world = self.context.world_size
        model = self.model()
        current = self.loader.batch_size
        best, gain = batch_choice.next_batch(model, self.limits, world, current, reason)
        if best == current:
            return 0
        log.info(
            "batch %d -> %d for %d worker(s) (%s; predicted goodput x%.2f, noise scale %.0f)",
            current,
            best,
            world,
            reason,
            gain,
            self.noise.noise_scale,
        )
        return best

    def apply(self, batch: int) -> None:
        """Train at global ``batch`` from the next step on (every rank, the same step)."""
        if batch == self.loader.batch_size:
            return
        self.previous_batch = int(self.loader.batch_size)
        self.steps_since_change = 0
        self.loader.batch_size = int(batch)
        self._last_end = None
        self._gain_cache = None
        self._readings.clear()
        self.recorder.forget_previous()

    @property
    def pending(self) -> str | None:
        """Why the batch is still to be looked at again: ``"world"`` (the world changed),
        ``"epoch"`` (an epoch began), or ``None``. Rank 0 decides, so only its value says
        whether a decision is still to come."""
        return self._pending

    # -- the model --------------------------------------------------------------------------

    def measured(self) -> bool:
        """Whether some configuration has been timed enough to fit a model on (before
        that, no report is sent: a policy is better off with its prior)."""
        return any(len(times) >= MIN_TIMING_SAMPLES for times in self.profile.values())

    def ready(self) -> bool:
        """A noise estimate to trust (:func:`~tidal.runtime.gradient_noise.estimate_trusted`)
        and step times for a decision: :data:`MIN_TIMING_SAMPLES` at the current
        configuration, or, when the world has just changed, any configuration timed."""
        if not estimate_trusted(self.noise.count, self.noise.relative_error):
            return False
        return self._timed() or (self._pending == "world" and self.measured())

    def _timed(self) -> bool:
        """Whether the current configuration has been timed enough to fit on."""
        key = self._config(self.context.world_size, self.loader.batch_size)
        return len(self.profile.get(key, ())) >= MIN_TIMING_SAMPLES

    @property
    def limits(self) -> BatchLimits:
        """The batch limits as they stand (``init_batch`` changes with a loaded state)."""
        return BatchLimits(
            self.init_batch, self.max_global, self.local_bounds, self.gradient_accumulation
        )

    def model(self) -> ThroughputModel:
        """The fitted throughput model with the current noise scale and batch limits."""
        return batch_choice.fitted_model(self.profile, self.noise.noise_scale, self.limits)

    def predicted_step_time(self, workers: int, batch: float, model: ThroughputModel) -> float:
        """Seconds per step at global ``batch`` (with gradient accumulation if needed)."""
        return batch_choice.predicted_step_time(model, self.limits, workers, batch)

    def predicted_goodput(self, workers: int, batch: float, model: ThroughputModel) -> float:
        """Initial-batch steps per second at global ``batch`` on ``workers``."""
        return batch_choice.predicted_goodput(model, self.limits, workers, batch)

    def best_batch(self, workers: int, model: ThroughputModel | None = None) -> int:
        """The global batch that maximises predicted goodput for ``workers``."""
        return batch_choice.best_global_batch(model or self.model(), self.limits, workers)

    def gain(self) -> float:
        """AdaScale gain of the current batch (1 at the initial batch)."""
        batch = self.loader.batch_size
        cached = self._gain_cache
        if cached is not None and cached[0] == batch and cached[1] == self.noise.count:
            return cached[2]
        value = adascale_gain(self.noise.noise_scale, self.init_batch, batch)
        self._gain_cache = (batch, self.noise.count, value)
        return value

    def gain_at(self, batch: float) -> float:
        """AdaScale gain of global ``batch`` with the current noise estimate."""
        return adascale_gain(self.noise.noise_scale, self.init_batch, batch)

    def _config(self, workers: int, batch: int) -> Configuration:
        return batch_choice.configuration(self.limits, workers, batch)

    # -- reports and state ------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """The goodput report: fitted model, noise scale, batch, efficiency, speed-up."""
        world, batch = self.context.world_size, self.loader.batch_size
        times = self.profile.get(self._config(world, batch), [])
        ready, step = self.ready(), self.context.step
        reading = BatchReading(world, batch, times, self.noise, self.progress, step, ready)
        return goodput_report(self.model(), self.limits, reading)

    def _report(self) -> None:
        try:
            report = self.report()
        except Exception as exc:  # a report must never cost the step
            log.debug("goodput report failed: %s", exc)
            return
        reporter().set_goodput(report)

    def state_dict(self) -> dict[str, Any]:
        """Everything learnt so far (plain data; part of the loader's state)."""
        return {
            "init_batch": self.init_batch,
            "noise": self.noise.state_dict(),
            "profile": {key: list(times) for key, times in self.profile.items()},
            "progress": self.progress,
            "pending": self._pending,
            "since_look": self._since_look,
            "look_after": self._look_after,
            "previous_batch": self.previous_batch,
            "steps_since_change": self.steps_since_change,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Adopt :meth:`state_dict`."""
        self.init_batch = int(state["init_batch"])
        self.noise.load_state_dict(state["noise"])
        self.profile = {tuple(k): list(v) for k, v in state["profile"].items()}
        self.progress = float(state["progress"])
        self._pending = state.get("pending")
        self._since_look = int(state.get("since_look", 0))
        self._look_after = int(state.get("look_after", RECHOOSE_STEPS))
        previous = state.get("previous_batch")
        self.previous_batch = int(previous) if previous is not None else None
        self.steps_since_change = int(state.get("steps_since_change", 0))
        self._gain_cache = None
        self._last_end = None
