"""The trace-driven cluster simulator.

Every ``interval`` seconds the simulator builds a :class:`~tidal.policy.api.JobRequest` for
each submitted, unfinished job, asks the policy for an allocation, checks it, and advances
every job by the interval:

* a job whose slots changed first spends ``reallocation_cost`` seconds making no progress;
* then it progresses at ``gain / step_time`` initial-batch steps per second, where ``gain``
  comes from the gradient statistics of its profile at its current progress and the step
  time from the measured placements (gradient accumulation when the per-worker batch does
  not fit);
* it finishes when its progress reaches the end of its last profiled epoch.

How a job is sized depends on the policy's :class:`~tidal.policy.registry.Sizing`: fixed
at the workload's ``num_replicas`` and ``batch_size``; elastic in workers (1 to
``num_replicas``) at the workload's batch; or adaptive, where the policy picks the workers
and the job picks the batch size that maximises its goodput for them (as tidal's runtime
does).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from tidal.policy.api import (
    Cluster,
    Host,
    JobRequest,
    Policy,
    Slot,
    ThroughputModel,
    job_request,
)
from tidal.policy.goodput_model import best_batch, noise_scale
from tidal.policy.registry import Sizing
from tidal.sim.profiles import ModelProfile
from tidal.sim.workload import WorkloadJob

log = logging.getLogger(__name__)


class AllocationError(RuntimeError):
    """A policy handed out slots that do not exist or are taken twice."""


@dataclass(frozen=True)
class SimConfig:
    """Cluster shape and timing of one simulation."""

    nodes: int = 16
    gpus_per_node: int = 4
    interval: float = 60.0
    reallocation_cost: float = 30.0
    #: Stop after this much simulated time even if jobs remain (guards against policies
    #: that never start a job).
    max_time: float = 30 * 24 * 3600.0

    def cluster(self) -> Cluster:
        """The simulated cluster."""
        return Cluster(tuple(Host(f"node{i:03d}", self.gpus_per_node) for i in range(self.nodes)))


@dataclass
class JobResult:
    """Outcome of one job."""

    name: str
    model: str
    submit_time: float
    start_time: float | None
    finish_time: float | None
    reallocations: int
    gpu_seconds: float
    #: Run time alone on the cluster at its requested size (for finish-time fairness).
    isolated_time: float

    @property
    def jct(self) -> float | None:
        """Job completion time (submission to finish), if it finished."""
        return None if self.finish_time is None else self.finish_time - self.submit_time


@dataclass
class SimResult:
    """Everything a simulation produced."""

    policy: str
    config: SimConfig
    jobs: list[JobResult]
    #: ``(time, {job: slots held})`` at every decision.
    timeline: list[tuple[float, dict[str, int]]]
    total_gpus: int
    #: Wall-clock seconds the policy spent deciding, per decision.
    decision_seconds: list[float] = field(default_factory=list)


@dataclass
class _Job:
    """Mutable state of one job during a run."""

    spec: WorkloadJob
    profile: ModelProfile
    progress: float = 0.0
    epoch: int = 0
    slots: tuple[Slot, ...] = ()
    #: Workers per node in the order of the job's ranks (see :func:`placement_shape`).
    placement: tuple[int, ...] = ()
    batch: int = 0
    per_step: float = 0.0
    blocked_for: float = 0.0
    attained: float = 0.0
    reallocations: int = 0
    start_time: float | None = None
    finish_time: float | None = None
    #: (placement, asked batch) -> (batch run, seconds per step); placements repeat.
    step_cache: dict[tuple[tuple[int, ...], int], tuple[int, float]] = field(default_factory=dict)


def placement_shape(slots: Sequence[Slot]) -> tuple[int, ...]:
    """Workers per node, nodes in the order the slots first name them.

    The order matters for placements of three or more nodes (the measurements key a ring
    of nodes by its smallest rotation): a policy lists a job's slots in the order its
    workers are ranked, as the Pollux artifact's allocations do.
    """
    per_host = Counter(name for name, _ in slots)
    return tuple(per_host[h] for h in dict.fromkeys(name for name, _ in slots))


def step_seconds(profile: ModelProfile, placement: tuple[int, ...], batch: int) -> float:
    """Seconds per optimiser step at global ``batch``, with gradient accumulation if needed."""
    workers = sum(placement)
    local = batch / workers
    micro_steps = max(1, math.ceil(local / profile.max_local_batch - 1e-9))
    atomic = local / micro_steps
    step, sync = profile.step_time(placement, atomic)
    # Each extra micro-step repeats the compute but not the gradient synchronisation.
    return step + (step - sync) * (micro_steps - 1)


def fixed_batch_step(
    profile: ModelProfile, placement: tuple[int, ...], batch: int
) -> tuple[int, float]:
    """Global batch actually run and seconds per step for a job fixed at ``batch``.

    The per-worker batch is rounded up to whole samples and split into equal micro-batches
    that fit on a GPU; one worker above the initial batch always accumulates (its memory
    was profiled at the initial batch), as the Pollux artifact's jobs do. Rounding up makes
    the batch run slightly larger than asked.
    """
    workers = sum(placement)
    local = math.ceil(batch / workers - 1e-8)
    accumulate = math.ceil(local / profile.max_local_batch - 1e-8) - 1
    if workers == 1 and batch > profile.init_batch:
        accumulate = max(1, accumulate)
    atomic = math.ceil(local / (accumulate + 1) - 1e-8)
    atomic = max(1, min(atomic, int(profile.max_batch / (workers * (accumulate + 1)))))
    step, sync = profile.step_time(placement, atomic)
    return workers * atomic * (accumulate + 1), step + (step - sync) * accumulate


def statistical_gain(profile: ModelProfile, batch: float, epoch: int) -> float:
    """Initial-batch steps one step at global ``batch`` is worth during ``epoch``."""
    sqr, var = profile.grad_stats_at(batch, epoch)
    scale = batch / profile.init_batch
    return scale if sqr <= 0 else (var + sqr) / (var / scale + sqr)


def progress_rate(profile: ModelProfile, epoch: int, batch: int, seconds_per_step: float) -> float:
    """Initial-batch steps per second during ``epoch``: the statistical gain over step time."""
    return statistical_gain(profile, batch, epoch) / seconds_per_step


def advance(job: _Job, seconds: float, now: float) -> None:
    """Run ``job`` for ``seconds`` starting at ``now`` at its batch and step time.

    The gradient statistics, and so the rate, are those of the epoch the job is in; they
    change at every epoch boundary (the profiles measure them once per epoch).
    """
    if not job.slots or job.finish_time is not None:
        return
    workers = len(job.slots)
    blocked = min(job.blocked_for, seconds)
    job.blocked_for -= blocked
    job.attained += blocked * workers
    elapsed = blocked
    boundaries = job.profile.epoch_progress
    while elapsed < seconds:
        rate = progress_rate(job.profile, job.epoch, job.batch, job.per_step)
        boundary = float(boundaries[job.epoch])
        # Epochs end on whole seconds, as in the Pollux artifact (whose clock is in seconds).
        needed = float(round((boundary - job.progress) / rate))
        if elapsed + needed <= seconds:
            job.progress = boundary
            elapsed += needed
            job.epoch += 1
            if job.epoch >= job.profile.epochs:
                job.finish_time = now + elapsed
                break
        else:
            job.progress += rate * (seconds - elapsed)
            elapsed = seconds
    job.attained += (elapsed - blocked) * workers


def packed_placement(replicas: int, per_node: int) -> tuple[int, ...]:
    """Workers per node of ``replicas`` workers on as few nodes as possible."""
    return tuple(
        [per_node] * (replicas // per_node) + ([replicas % per_node] if replicas % per_node else [])
    )


def isolated_time(profile: ModelProfile, replicas: int, batch: int, config: SimConfig) -> float:
    """Seconds ``replicas`` workers packed on nodes take alone at ``batch`` (one start-up)."""
    placement = packed_placement(replicas, config.gpus_per_node)
    run_batch, per_step = fixed_batch_step(profile, placement, batch)
    total = config.reallocation_cost
    progress = 0.0
    for epoch, boundary in enumerate(profile.epoch_progress):
        rate = progress_rate(profile, epoch, run_batch, per_step)
        total += float(round((float(boundary) - progress) / rate))
        progress = float(boundary)
    return total


def check_allocation(
    allocation: Mapping[str, tuple[Slot, ...]], cluster: Cluster, active: set[str]
) -> None:
    """Raise :class:`AllocationError` unless every slot exists and is held once."""
    sizes = {h.name: h.slots for h in cluster.hosts}
    seen: set[Slot] = set()
    for job_id, slots in allocation.items():
        if job_id not in active:
            raise AllocationError(f"slots for unknown or finished job {job_id}")
        for host, index in slots:
            if host not in sizes or not 0 <= index < sizes[host]:
                raise AllocationError(f"{job_id} got slot {(host, index)} that does not exist")
            if (host, index) in seen:
                raise AllocationError(f"slot {(host, index)} handed out twice")
            seen.add((host, index))


class Simulator:
    """Replays a workload through one policy."""

    def __init__(
        self,
        policy: Policy,
        sizing: Sizing,
        profiles: Mapping[str, ModelProfile],
        config: SimConfig | None = None,
    ) -> None:
        """``sizing`` says how the policy's jobs are sized (see the module docstring)."""
        self.policy = policy
        self.sizing = sizing
        self.profiles = profiles
        self.config = config or SimConfig()
        self.cluster = self.config.cluster()
        self.host_names = [h.name for h in self.cluster.hosts]

    def _request(self, job: _Job, now: float) -> JobRequest:
        """What the policy sees of ``job``."""
        spec, profile = job.spec, job.profile
        total = self.cluster.total_slots
        throughput = None
        if self.sizing is Sizing.FIXED:
            low = high = min(spec.num_replicas, total)
        elif self.sizing is Sizing.ELASTIC:
            low, high = 1, min(spec.num_replicas, total)
        else:
            throughput = self._current_model(job)
            # More workers than the largest batch has samples per worker cannot help.
            low, high = 1, min(total, max(1, profile.max_batch // max(profile.min_local_batch, 1)))
        return job_request(
            spec.name,
            min_slots=low,
            max_slots=high,
            now=now,
            age_from=spec.submit_time,
            submitted_at=spec.submit_time,
            attained_service=job.attained,
            throughput=throughput,
            reallocations=job.reallocations,
            team=spec.team,
            started_at=job.start_time,
        )

    def _current_model(self, job: _Job) -> ThroughputModel:
        """The job's throughput model with the noise scale it measures now (at its batch)."""
        profile = job.profile
        sqr, var = profile.grad_stats_at(job.batch or profile.init_batch, job.epoch)
        return replace(
            profile.throughput, grad_noise_scale=noise_scale(sqr, var, profile.init_batch)
        )

    def _configure(self, job: _Job, placement: tuple[int, ...]) -> tuple[int, float]:
        """Global batch and seconds per step for ``job`` on ``placement`` under this sizing."""
        if self.sizing is not Sizing.ADAPTIVE:
            key = (placement, job.spec.batch_size)
            cached = job.step_cache.get(key)
            if cached is None:
                cached = fixed_batch_step(job.profile, placement, job.spec.batch_size)
                job.step_cache[key] = cached
            return cached
        batch, _ = best_batch(self._current_model(job), sum(placement), len(placement))
        key = (placement, batch)
        cached = job.step_cache.get(key)
        if cached is None:
            cached = (batch, step_seconds(job.profile, placement, batch))
            job.step_cache[key] = cached
        return cached

    def run(self, workload: Sequence[WorkloadJob]) -> SimResult:
        """Simulate until every job finished (or ``max_time``)."""
        config = self.config
        jobs = [
            _Job(spec, self.profiles[spec.model])
            for spec in sorted(workload, key=lambda j: (j.submit_time, j.name))
        ]
        pending = list(jobs)
        active: list[_Job] = []
        timeline: list[tuple[float, dict[str, int]]] = []
        decision_seconds: list[float] = []
        previous: dict[str, tuple[Slot, ...]] = {}
        # The first decision comes one interval in, as in the Pollux artifact's simulator.
        now = config.interval
        while (pending or active) and now <= config.max_time:
            while pending and pending[0].spec.submit_time <= now:
                active.append(pending.pop(0))
            if not active:
                # Idle cluster: jump to the decision right after the next arrival.
                arrival = pending[0].spec.submit_time
                now = max(1, math.ceil(arrival / config.interval)) * config.interval
                continue
            requests = [self._request(job, now) for job in active]
            started = time.perf_counter()
            allocation = self.policy.allocate(requests, self.cluster, previous)
            decision_seconds.append(time.perf_counter() - started)
            check_allocation(allocation, self.cluster, {j.spec.name for j in active})
            for job in active:
                ranked = tuple(allocation.get(job.spec.name, ()))
                slots = tuple(sorted(ranked))
                if slots != job.slots:
                    if job.start_time is not None:
                        job.reallocations += 1
                    if slots:
                        job.blocked_for = config.reallocation_cost
                        if job.start_time is None:
                            job.start_time = now
                    job.slots = slots
                    job.placement = placement_shape(ranked)
                if slots:
                    placement = job.placement
                    job.batch, job.per_step = self._configure(job, placement)
                    advance(job, config.interval, now)
            timeline.append((now, {j.spec.name: len(j.slots) for j in active if j.slots}))
            previous = {j.spec.name: j.slots for j in active if j.slots and j.finish_time is None}
            active = [j for j in active if j.finish_time is None]
            now += config.interval
        if pending or active:
            log.warning(
                "stopped at %.0f s with %d jobs unfinished", now, len(pending) + len(active)
            )
        return SimResult(
            policy=self.policy.name,
            config=config,
            jobs=[self._result(job) for job in jobs],
            timeline=timeline,
            total_gpus=self.cluster.total_slots,
            decision_seconds=decision_seconds,
        )

    def _result(self, job: _Job) -> JobResult:
        """Freeze a job's outcome."""
        spec = job.spec
        return JobResult(
            name=spec.name,
            model=spec.model,
            submit_time=spec.submit_time,
            start_time=job.start_time,
            finish_time=job.finish_time,
            reallocations=job.reallocations,
            gpu_seconds=job.attained,
            isolated_time=isolated_time(
                job.profile,
                min(spec.num_replicas, self.cluster.total_slots),
                spec.batch_size,
                self.config,
            ),
        )
