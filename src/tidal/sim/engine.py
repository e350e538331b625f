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

How a job is sized depends on the policy's :class:`Sizing`: fixed at the workload's
``num_replicas`` and ``batch_size``; elastic in workers (1 to ``num_replicas``) at the
workload's batch; or adaptive, where the policy picks the workers and the job picks the
batch size that maximises its goodput for them (as tidal's runtime does).
"""

from __future__ import annotations

import enum
import logging
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from tidal.policy.api import Cluster, Host, JobRequest, Policy, Slot
from tidal.policy.goodput_model import best_batch, noise_scale
from tidal.sim.profiles import ModelProfile
from tidal.sim.workload import WorkloadJob

log = logging.getLogger(__name__)


class Sizing(enum.Enum):
    """How the simulator sizes jobs for a policy."""

    FIXED = "fixed"
    ELASTIC = "elastic"
    ADAPTIVE = "adaptive"


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
    slots: tuple[Slot, ...] = ()
    batch: int = 0
    blocked_for: float = 0.0
    attained: float = 0.0
    reallocations: int = 0
    start_time: float | None = None
    finish_time: float | None = None
    #: (placement, global batch) -> seconds per step; placements repeat, so this saves work.
    step_cache: dict[tuple[tuple[int, ...], int], float] = field(default_factory=dict)


def placement_shape(slots: Sequence[Slot], hosts: Sequence[str]) -> tuple[int, ...]:
    """Workers per node, in cluster host order, nodes without workers left out."""
    per_host = Counter(name for name, _ in slots)
    return tuple(per_host[h] for h in hosts if per_host[h] > 0)


def step_seconds(profile: ModelProfile, placement: tuple[int, ...], batch: int) -> float:
    """Seconds per optimiser step at global ``batch``, with gradient accumulation if needed."""
    workers = sum(placement)
    local = batch / workers
    micro_steps = max(1, math.ceil(local / profile.max_local_batch - 1e-9))
    atomic = local / micro_steps
    step, sync = profile.step_time(placement, atomic)
    # Each extra micro-step repeats the compute but not the gradient synchronisation.
    return step + (step - sync) * (micro_steps - 1)


def progress_rate(
    profile: ModelProfile, progress: float, batch: int, seconds_per_step: float
) -> float:
    """Initial-batch steps per second at ``progress``: the statistical gain over step time."""
    sqr, var = profile.grad_stats(progress)
    scale = batch / profile.init_batch
    gain = scale if sqr <= 0 else (var + sqr) / (var / scale + sqr)
    return gain / seconds_per_step


def advance(job: _Job, seconds: float, now: float, placement: tuple[int, ...]) -> None:
    """Run ``job`` for ``seconds`` starting at ``now`` on workers per node ``placement``."""
    if not job.slots or job.finish_time is not None:
        return
    workers = len(job.slots)
    blocked = min(job.blocked_for, seconds)
    job.blocked_for -= blocked
    job.attained += blocked * workers
    elapsed = blocked
    key = (placement, job.batch)
    per_step = job.step_cache.get(key)
    if per_step is None:
        per_step = step_seconds(job.profile, placement, job.batch)
        job.step_cache[key] = per_step
    boundaries = job.profile.epoch_progress
    target = job.profile.target_progress
    while elapsed < seconds:
        rate = progress_rate(job.profile, job.progress, job.batch, per_step)
        # Re-evaluate the gradient statistics at every epoch boundary.
        upcoming = boundaries[boundaries > job.progress + 1e-9]
        boundary = float(upcoming[0]) if len(upcoming) else target
        needed = (boundary - job.progress) / rate
        if elapsed + needed < seconds:
            job.progress = boundary
            elapsed += needed
            if boundary >= target:
                job.finish_time = now + elapsed
                break
        else:
            job.progress += rate * (seconds - elapsed)
            elapsed = seconds
    job.attained += (elapsed - blocked) * workers


def isolated_time(profile: ModelProfile, replicas: int, batch: int, config: SimConfig) -> float:
    """Seconds ``replicas`` workers packed on nodes take alone at ``batch`` (one start-up).

    Gradient statistics are taken at the start of each epoch; the engine also re-reads them
    at every scheduling interval, so the two differ by a fraction of a percent.
    """
    per_node = config.gpus_per_node
    placement = tuple(
        [per_node] * (replicas // per_node) + ([replicas % per_node] if replicas % per_node else [])
    )
    per_step = step_seconds(profile, placement, batch)
    total = config.reallocation_cost
    progress = 0.0
    for boundary in profile.epoch_progress:
        rate = progress_rate(profile, progress, batch, per_step)
        total += (float(boundary) - progress) / rate
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
            sqr, var = profile.grad_stats(job.progress)
            throughput = replace(
                profile.throughput, grad_noise_scale=noise_scale(sqr, var, profile.init_batch)
            )
            # More workers than the largest batch has samples per worker cannot help.
            low, high = 1, min(total, max(1, profile.max_batch // max(profile.min_local_batch, 1)))
        return JobRequest(
            job_id=spec.name,
            min_workers=low,
            max_workers=high,
            submitted_at=spec.submit_time,
            attained_service=job.attained,
            throughput=throughput,
            age=now - spec.submit_time,
            reallocations=job.reallocations,
        )

    def _choose_batch(self, job: _Job, placement: tuple[int, ...]) -> int:
        """Global batch for ``job`` on ``placement`` under this run's sizing."""
        if self.sizing is not Sizing.ADAPTIVE:
            return job.spec.batch_size
        profile = job.profile
        sqr, var = profile.grad_stats(job.progress)
        model = replace(
            profile.throughput, grad_noise_scale=noise_scale(sqr, var, profile.init_batch)
        )
        batch, _ = best_batch(model, sum(placement), len(placement))
        return batch

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
        now = 0.0
        while (pending or active) and now <= config.max_time:
            while pending and pending[0].spec.submit_time <= now:
                active.append(pending.pop(0))
            if not active:
                # Idle cluster: jump to the decision right after the next arrival.
                arrival = pending[0].spec.submit_time
                now = math.ceil(arrival / config.interval) * config.interval
                continue
            requests = [self._request(job, now) for job in active]
            started = time.perf_counter()
            allocation = self.policy.allocate(requests, self.cluster, previous)
            decision_seconds.append(time.perf_counter() - started)
            check_allocation(allocation, self.cluster, {j.spec.name for j in active})
            for job in active:
                slots = tuple(sorted(allocation.get(job.spec.name, ())))
                if slots != job.slots:
                    if job.start_time is not None:
                        job.reallocations += 1
                    if slots:
                        job.blocked_for = config.reallocation_cost
                        if job.start_time is None:
                            job.start_time = now
                    job.slots = slots
                if slots:
                    placement = placement_shape(slots, self.host_names)
                    job.batch = self._choose_batch(job, placement)
                    advance(job, config.interval, now, placement)
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
