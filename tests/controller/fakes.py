"""Test doubles: an in-memory backend and a small priority policy (tests only)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tidal.launch.api import JobLaunch, JobStatus, MetricPoint, WorkerState, WorkerStatus
from tidal.policy.api import Allocation, Cluster, JobRequest, Slot


@dataclass
class _FakeJob:
    launch: JobLaunch
    workers: list[WorkerStatus] = field(default_factory=list)
    generation: int = 0
    finished: bool = False
    failed: bool = False
    reason: str = ""
    #: Slots asked for but not yet applied (``instant=False``).
    pending: tuple[Slot, ...] | None = None
    #: Reports handed over with the next poll.
    metrics: list[MetricPoint] = field(default_factory=list)
    goodput: dict[str, Any] | None = None


class FakeBackend:
    """Workers that exist only as records. ``instant=False`` defers every change until
    :meth:`advance`, like a real job that applies it at its next step boundary."""

    def __init__(self, instant: bool = True) -> None:
        self.instant = instant
        self.jobs: dict[str, _FakeJob] = {}
        self.calls: list[tuple[str, str, int]] = []
        self.stopped: set[str] = set()
        self._next_worker = 0

    # -- the Backend interface --------------------------------------------------------------

    def start(self, launch: JobLaunch, slots: Sequence[Slot]) -> None:
        """Record the launch and put a worker on each slot."""
        self.calls.append(("start", launch.job_id, len(slots)))
        self.stopped.discard(launch.job_id)
        old = self.jobs.get(launch.job_id)
        job = _FakeJob(launch=launch, workers=list(old.workers) if old else [])
        job.generation = (old.generation if old else 0) + 1
        self.jobs[launch.job_id] = job
        self._set(job, tuple(slots))

    def assign(self, job_id: str, slots: Sequence[Slot]) -> None:
        """Release workers off ``slots``, start one on each uncovered slot."""
        self.calls.append(("assign", job_id, len(slots)))
        self._set(self.jobs[job_id], tuple(slots))

    def stop(self, job_id: str) -> None:
        """Release every worker of the job."""
        self.calls.append(("stop", job_id, 0))
        self.stopped.add(job_id)
        job = self.jobs.get(job_id)
        if job is not None:
            self._set(job, ())
        self._forget_stopped()

    def poll(self) -> Mapping[str, JobStatus]:
        """Snapshots of every job ever started (reports are handed over once)."""
        out = {
            job_id: JobStatus(
                job_id=job_id,
                generation=job.generation,
                workers=tuple(job.workers),
                finished=job.finished,
                failed=job.failed,
                reason=job.reason,
                metrics=tuple(job.metrics),
                goodput=job.goodput,
            )
            for job_id, job in self.jobs.items()
        }
        for job in self.jobs.values():
            job.metrics, job.goodput = [], None
        return out

    def log_paths(self, job_id: str) -> Mapping[int, Path]:
        """The log file each worker wrote when it started."""
        job = self.jobs.get(job_id)
        if job is None or job.launch.log_dir is None:
            return {}
        return {w.worker_id: job.launch.log_dir / f"worker-{w.worker_id}.log" for w in job.workers}

    def close(self) -> None:
        """Stop every job."""
        for job_id in list(self.jobs):
            self.stop(job_id)

    # -- what tests drive -------------------------------------------------------------------

    def advance(self) -> None:
        """Apply every pending change (the jobs reached a step boundary)."""
        for job in self.jobs.values():
            if job.pending is not None:
                self._apply(job, job.pending)
                job.pending = None
        self._forget_stopped()

    def _forget_stopped(self) -> None:
        for job_id in self.stopped & set(self.jobs):
            job = self.jobs[job_id]
            if job.pending is None and not any(w.state.alive for w in job.workers):
                del self.jobs[job_id]

    def report(
        self,
        job_id: str,
        metrics: Sequence[MetricPoint] = (),
        goodput: dict[str, Any] | None = None,
    ) -> None:
        """Reports the job's workers sent, handed over with the next poll."""
        job = self.jobs[job_id]
        job.metrics.extend(metrics)
        if goodput is not None:
            job.goodput = goodput

    def fail_worker(self, job_id: str, index: int = 0, exit_code: int = 1) -> WorkerStatus:
        """Make the ``index``-th live worker of the job fail."""
        job = self.jobs[job_id]
        alive = [i for i, w in enumerate(job.workers) if w.state.alive]
        i = alive[index]
        job.workers[i] = replace(job.workers[i], state=WorkerState.FAILED, exit_code=exit_code)
        return job.workers[i]

    def finish(self, job_id: str) -> None:
        """Every worker of the job returns 0."""
        job = self.jobs[job_id]
        job.workers = [
            replace(w, state=WorkerState.EXITED, exit_code=0) if w.state.alive else w
            for w in job.workers
        ]
        job.finished = True

    def forget(self, job_id: str) -> None:
        """Lose the job, as a restarted backend would."""
        del self.jobs[job_id]

    def alive(self, job_id: str) -> set[Slot]:
        """Slots the job's live workers are on (none once it is forgotten)."""
        job = self.jobs.get(job_id)
        return {w.slot for w in job.workers if w.state.alive} if job else set()

    # -- internals ------------------------------------------------------------------------

    def _set(self, job: _FakeJob, slots: tuple[Slot, ...]) -> None:
        if self.instant:
            self._apply(job, slots)
        else:
            job.pending = slots

    def _apply(self, job: _FakeJob, slots: tuple[Slot, ...]) -> None:
        keep = set(slots)
        job.workers = [
            replace(w, state=WorkerState.RELEASED) if w.state.alive and w.slot not in keep else w
            for w in job.workers
        ]
        covered = {w.slot for w in job.workers if w.state.alive}
        for slot in slots:
            if slot in covered:
                continue
            worker = WorkerStatus(
                self._next_worker, slot, WorkerState.RUNNING, pid=1000 + self._next_worker
            )
            self._next_worker += 1
            job.workers.append(worker)
            if job.launch.log_dir is not None:
                job.launch.log_dir.mkdir(parents=True, exist_ok=True)
                path = job.launch.log_dir / f"worker-{worker.worker_id}.log"
                path.write_text("".join(f"worker {worker.worker_id} line {i}\n" for i in range(5)))
        job.generation += 1


class GreedyPolicy:
    """Highest priority first, each job as many slots as it wants; keeps slots in place."""

    name = "greedy"

    def allocate(
        self, jobs: Sequence[JobRequest], cluster: Cluster, previous: Allocation
    ) -> dict[str, tuple[Slot, ...]]:
        """Jobs in priority order, each its target or max if at least its min is free."""
        held = {s for slots in previous.values() for s in slots}
        taken: set[Slot] = set()
        out: dict[str, tuple[Slot, ...]] = {}
        for job in sorted(jobs, key=lambda j: (-j.priority, j.submitted_at, j.job_id)):
            want = job.target_slots or job.max_slots
            hosts = {h.name for h in cluster.hosts if job.group in (None, h.group)}
            usable = [s for s in cluster.slots() if s[0] in hosts and s not in taken]
            mine = [s for s in previous.get(job.job_id, ()) if s in usable]
            free = [s for s in usable if s not in mine and s not in held]
            others = [s for s in usable if s not in mine and s in held]
            pick = (mine + free + others)[:want]
            if len(pick) >= job.min_slots:
                out[job.job_id] = tuple(pick)
                taken.update(pick)
        return out


class BrokenPolicy:
    """Gives every job the same slot: always an invalid allocation."""

    name = "broken"

    def allocate(
        self, jobs: Sequence[JobRequest], cluster: Cluster, previous: Allocation
    ) -> dict[str, tuple[Slot, ...]]:
        """Slot 0 for everyone."""
        return {j.job_id: (cluster.slots()[0],) for j in jobs}


#: A parameter-server job: two servers (fixed) and one to three workers (elastic).
PS_JOB = """
name: ps-digits
roles:
  - name: ps
    command: python ps_digits.py
    replicas: 2
    launcher: ps
    resources: {gpus: 0}
  - name: worker
    command: python ps_digits.py
    replicas: "1:3"
    launcher: ps
    resources: {gpus: 0}
"""
