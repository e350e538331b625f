"""The controller loop: the only writer of desired state.

Each tick follows the hosts of a backend that reports them (see
:class:`~tidal.backends.base.HostDiscovery`), observes what the backend reports (finished,
failed, lost workers; rescales that have settled), carries out users' requests (cancel,
scale-out deadlines), asks the policy for the next allocation and tells the backend the
difference. Every change is written to the store with an event and, when slots change, a
point on the allocation timeline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tidal.backends.base import (
    Backend,
    HostDiscovery,
    JobLaunch,
    JobStatus,
    WorkerState,
    WorkerStatus,
)
from tidal.controller.cluster import ClusterModel
from tidal.controller.metrics import ControllerMetrics
from tidal.controller.store import ACTIVE_STATES, Event, JobRecord, JobState, Store
from tidal.policy.api import JobRequest, Policy, Slot, ThroughputModel
from tidal.policy.goodput_model import model_from_dict
from tidal.policy.restart import Fail, LostWorker, Noop, RestartView, decide_restart
from tidal.spec import JobSpec

__all__ = ["Controller"]

log = logging.getLogger(__name__)


class Controller:
    """Reconciles the store's jobs with the cluster through a policy and a backend."""

    def __init__(
        self,
        store: Store,
        cluster: ClusterModel,
        policy: Policy,
        backend: Backend,
        data_dir: Path,
        *,
        metrics: ControllerMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.cluster = cluster
        self.policy = policy
        self.backend = backend
        self.data_dir = data_dir
        self.metrics = metrics or ControllerMetrics()
        self._clock = clock
        self._last_tick: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Last problem reported per job, so a condition that lasts is one event, not one a tick.
        self._noted: dict[str, str] = {}
        # Specs never change after submission; parsing each one once keeps ticks cheap.
        self._specs: dict[str, JobSpec] = {}
        self.metrics.slots_total.set(cluster.total_slots)

    # -- running ---------------------------------------------------------------------------

    def start(self, interval: float = 0.5) -> None:
        """Tick every ``interval`` seconds in a background thread until :meth:`stop`."""
        if self._thread is not None:
            raise RuntimeError("controller already started")
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(interval,), name="tidal-controller", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop ticking (the backend's jobs keep running until the backend is closed)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("controller thread did not stop within %.1fs", timeout)
            self._thread = None

    def _run(self, interval: float) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:
                # One bad tick (a database hiccup) must not end scheduling for everyone.
                log.exception("controller tick failed")
            self._stop.wait(interval)

    def tick(self) -> None:
        """One round: observe, act on requests, allocate, apply."""
        with self._lock:
            now = self._clock()
            elapsed = 0.0 if self._last_tick is None else max(0.0, now - self._last_tick)
            self._last_tick = now
            self._discover()
            statuses = dict(self.backend.poll())
            jobs = []
            for job in self.store.list_jobs(states=ACTIVE_STATES):
                observed = self._observe(job, statuses.get(job.id), now, elapsed)
                if observed is not None:
                    jobs.append(self._check_deadline(observed, now))
            live = {j.id for j in jobs}
            self._specs = {k: v for k, v in self._specs.items() if k in live}
            held = self._schedule(jobs, statuses, now)
            self._refresh_gauges(held)
            self.metrics.ticks.inc()

    # -- observing -------------------------------------------------------------------------

    def _discover(self) -> None:
        """Take the backend's hosts as the cluster, when it reports them."""
        if not isinstance(self.backend, HostDiscovery):
            return
        try:
            cluster = ClusterModel.from_hosts(self.backend.hosts())
        except Exception:
            # Keep the last known hosts: a slow or failing lookup must not empty the cluster.
            log.exception("backend hosts() failed")
            return
        if cluster == self.cluster:
            return
        old = {h.name: h.slots for h in self.cluster.hosts}
        new = {h.name: h.slots for h in cluster.hosts}
        changes = [f"+{n} ({k} slots)" for n, k in new.items() if n not in old]
        changes += [f"-{n}" for n in old if n not in new]
        changes += [f"{n}: {old[n]} → {k} slots" for n, k in new.items() if old.get(n, k) != k]
        message = f"{len(new)} host(s), {cluster.total_slots} slots: " + ", ".join(changes)
        log.info("cluster changed: %s", message)
        self.store.add_event(None, "cluster", message)
        self.cluster = cluster
        self.metrics.slots_total.set(cluster.total_slots)

    def _observe(
        self, job: JobRecord, status: JobStatus | None, now: float, elapsed: float
    ) -> JobRecord | None:
        """Apply what the backend reports; the job as it is now, or None once it is over."""
        if job.cancel_requested:
            if status is not None:
                self._call(job, "stop", lambda: self.backend.stop(job.id))
            self.store.update_job(
                job.id,
                now,
                slots=() if job.slots else None,
                state=JobState.CANCELLED,
                reason="cancelled by user",
                finished_at=now,
                scale_deadline=None,
                event=Event("cancelled", "cancelled by user"),
            )
            return None
        if not job.state.holds_slots:
            return job
        if status is None:
            # The backend does not run it (e.g. the controller restarted): queue it again so
            # it resumes from its checkpoint instead of being counted as running forever.
            return self.store.update_job(
                job.id,
                now,
                slots=(),
                state=JobState.QUEUED,
                reason="workers lost; requeued to resume from checkpoint",
                event=Event("lost", "the backend no longer runs this job's workers"),
            )
        newly_failed = self.store.sync_workers(job.id, status.workers, now)
        self._record_reports(job, status, now)
        if status.finished:
            # Nothing left to stop: this releases what the backend still holds for the job.
            self._call(job, "stop", lambda: self.backend.stop(job.id))
            self.store.update_job(
                job.id,
                now,
                slots=(),
                state=JobState.SUCCEEDED,
                reason="all workers finished",
                finished_at=now,
                scale_deadline=None,
                event=Event("succeeded", "all workers finished"),
            )
            return None
        if status.failed:
            self._call(job, "stop", lambda: self.backend.stop(job.id))
            self._fail(job, now, status.reason or "the backend reported the job failed")
            return None
        if newly_failed:
            return self._on_failures(job, newly_failed, status, now)
        changes: dict[str, Any] = {
            "attained_service": job.attained_service + elapsed * len(job.slots)
        }
        event = None
        if job.state is JobState.RESCALING and self._settled(job, status):
            stall = now - (job.rescale_started_at or now)
            self.metrics.rescale_stall.observe(stall)
            changes.update(
                state=JobState.RUNNING,
                reason=f"running on {len(job.slots)} slot(s)",
                rescale_started_at=None,
            )
            event = Event("rescaled", f"now {len(job.slots)} worker(s)", {"stall_s": stall})
        return self.store.update_job(job.id, now, event=event, **changes)

    def _record_reports(self, job: JobRecord, status: JobStatus, now: float) -> None:
        """Store what the workers reported: metrics (``tidal.log_metrics``) and the newest
        goodput report, which the policy reads as the job's throughput model."""
        try:
            if status.metrics:
                self.store.add_metrics_many(
                    job.id, [(m.step, m.time, m.values) for m in status.metrics]
                )
            if status.goodput is not None:
                self.store.set_goodput(job.id, status.goodput, now)
        except Exception:
            # Reports are for charts and the policy; losing one must not stop scheduling.
            log.exception("recording reports of %s failed", job.id)

    def _throughput(self, job_ids: Sequence[str]) -> dict[str, ThroughputModel]:
        """Each job's reported throughput model (jobs that reported none are absent)."""
        models: dict[str, ThroughputModel] = {}
        for job_id, record in self.store.goodput(job_ids).items():
            raw = record.report.get("model")
            if not isinstance(raw, Mapping):
                continue
            try:
                models[job_id] = model_from_dict(raw)
            except ValueError:
                log.warning("job %s reported an unreadable throughput model", job_id)
        return models

    @staticmethod
    def _settled(job: JobRecord, status: JobStatus) -> bool:
        running = {w.slot for w in status.workers if w.state is WorkerState.RUNNING}
        return status.alive_slots() == set(job.slots) and running == set(job.slots)

    def _on_failures(
        self, job: JobRecord, failed: Sequence[WorkerStatus], status: JobStatus, now: float
    ) -> JobRecord | None:
        limit = self._spec(job).restart.max_restarts
        # Only running workers hold the training state (a starting one has none yet).
        running = any(w.state is WorkerState.RUNNING for w in status.workers)
        view = RestartView(max_restarts=limit, restarts=job.restarts, group_gone=not running)
        lost = [LostWorker(str(w.worker_id), w.slot[0], w.exit_code) for w in failed]
        decision = decide_restart(view, lost)
        if isinstance(decision, Noop):
            return job
        if isinstance(decision, Fail):
            self._call(job, "stop", lambda: self.backend.stop(job.id))
            self._fail(job, now, decision.reason, restarts=decision.restarts)
            return None
        # Same slots again: the backend starts a fresh worker on each slot without a live one.
        # Not on slots whose host left the cluster: the policy moves the job off them.
        slots = tuple(s for s in job.slots if self.cluster.has_slot(s))
        self._call(job, "assign", lambda: self.backend.assign(job.id, slots))
        ids = ", ".join(decision.workers)
        return self.store.update_job(
            job.id,
            now,
            state=JobState.RESCALING,
            restarts=decision.restarts,
            generation=job.generation + 1,
            rescale_started_at=now,
            reason=decision.reason,
            event=Event(
                "worker_failed",
                f"worker {ids} failed; replacing it (restart {decision.restarts} of {limit})",
                {
                    "workers": ids,
                    "exit_codes": list(decision.exit_codes),
                    "restarts": decision.restarts,
                },
            ),
        )

    def _fail(self, job: JobRecord, now: float, reason: str, **changes: Any) -> None:
        self.store.update_job(
            job.id,
            now,
            slots=() if job.slots else None,
            state=JobState.FAILED,
            reason=reason,
            finished_at=now,
            scale_deadline=None,
            event=Event("failed", reason),
            **changes,
        )

    def _check_deadline(self, job: JobRecord, now: float) -> JobRecord:
        if job.scale_deadline is None:
            return job
        target = job.target_workers or 0
        if job.state is JobState.RUNNING and len(job.slots) >= target:
            return self.store.update_job(
                job.id,
                now,
                scale_deadline=None,
                scale_previous=None,
                event=Event("scale_out_done", f"reached {len(job.slots)} worker(s)"),
            )
        if now < job.scale_deadline:
            return job
        return self.store.update_job(
            job.id,
            now,
            target_workers=job.scale_previous,
            scale_deadline=None,
            scale_previous=None,
            event=Event(
                "scale_out_rolled_back",
                f"could not reach {target} worker(s) in time; target restored",
                {"target": target, "restored": job.scale_previous},
            ),
        )

    # -- allocating ------------------------------------------------------------------------

    def _schedule(
        self, jobs: Sequence[JobRecord], statuses: Mapping[str, JobStatus], now: float
    ) -> dict[str, tuple[Slot, ...]]:
        """Allocate and apply; returns the slots each job holds afterwards."""
        held = {j.id: j.slots for j in jobs if j.slots}
        placeable = [j for j in jobs if self._placeable(j, now)]
        models = self._throughput([j.id for j in placeable])
        requests = [
            JobRequest(
                job_id=j.id,
                min_workers=j.min_workers,
                max_workers=j.max_workers,
                priority=j.priority,
                submitted_at=j.submitted_at,
                group=j.target_group,
                attained_service=j.attained_service,
                target_workers=j.target_workers,
                throughput=models.get(j.id),
                age=now - j.started_at if j.started_at is not None else 0.0,
                reallocations=j.generation,
            )
            for j in placeable
        ]
        previous = {j.id: j.slots for j in jobs if j.slots}
        try:
            proposed = self.policy.allocate(requests, self.cluster.to_policy(), previous)
        except Exception as exc:
            log.exception("policy %s failed", getattr(self.policy, "name", "?"))
            self._note_policy_error(f"{type(exc).__name__}: {exc}")
            return held
        allocation = self._checked(proposed, placeable)
        if allocation is None:
            return held
        changes = [
            (j, tuple(sorted(allocation.get(j.id, ()))))
            for j in jobs
            if set(allocation.get(j.id, ())) != set(j.slots)
        ]
        # Release before acquiring: a slot moves to its new job only once its old worker left.
        changes.sort(key=lambda c: bool(set(c[1]) - set(c[0].slots)))
        occupied = {slot: job_id for job_id, st in statuses.items() for slot in st.alive_slots()}
        for job, slots in changes:
            busy = sorted(
                s for s in set(slots) - set(job.slots) if occupied.get(s, job.id) != job.id
            )
            if busy:
                self._note(job, f"waiting for {len(busy)} slot(s) to be released")
                continue
            held[job.id] = self._apply(job, slots, now, known=job.id in statuses)
        return held

    def _placeable(self, job: JobRecord, now: float) -> bool:
        spec = self._spec(job)
        if self.cluster.can_place(job.target_group, spec.target.labels, job.min_workers):
            return True
        if job.state is JobState.QUEUED:
            reason = (
                f"needs {job.min_workers} slot(s) matching group={job.target_group} "
                f"labels={dict(spec.target.labels)}; the cluster has fewer"
            )
            if job.reason != reason:
                self.store.update_job(
                    job.id, now, reason=reason, event=Event("unplaceable", reason)
                )
        return False

    def _checked(
        self, proposed: Mapping[str, Sequence[Slot]], jobs: Sequence[JobRecord]
    ) -> dict[str, tuple[Slot, ...]] | None:
        """The policy's answer, or None when it breaks a rule (nothing is applied then)."""
        by_id = {j.id: j for j in jobs}
        seen: set[Slot] = set()
        problems: list[str] = []
        for job_id, slots in proposed.items():
            job = by_id.get(job_id)
            if job is None:
                problems.append(f"unknown job {job_id}")
                continue
            if len(set(slots)) != len(slots) or seen & set(slots):
                problems.append(f"{job_id}: a slot given twice")
            seen |= set(slots)
            if slots and not job.min_workers <= len(slots) <= job.max_workers:
                problems.append(
                    f"{job_id}: {len(slots)} slot(s) outside [{job.min_workers}, {job.max_workers}]"
                )
            for host, index in slots:
                model = self.cluster.host(host)
                if model is None or not 0 <= index < model.slots:
                    problems.append(f"{job_id}: no slot {host}:{index}")
                elif not model.matches(job.target_group, self._spec(job).target.labels):
                    problems.append(f"{job_id}: host {host} does not match the job's target")
        if problems:
            message = "; ".join(problems)
            log.error("policy %s returned an invalid allocation: %s", self.policy.name, message)
            self._note_policy_error(f"invalid allocation: {message}")
            return None
        self._noted.pop("", None)
        return {k: tuple(v) for k, v in proposed.items() if v}

    def _apply(
        self, job: JobRecord, slots: tuple[Slot, ...], now: float, *, known: bool
    ) -> tuple[Slot, ...]:
        """Tell the backend and record it; returns the slots the job holds afterwards.

        ``known``: the backend still has the job (preempted to zero earlier), so it resumes
        with ``assign`` rather than a fresh ``start``.
        """
        self._noted.pop(job.id, None)
        old = len(job.slots)
        if not job.slots:
            resumed = job.started_at is not None
            if known:
                ok = self._call(job, "assign", lambda: self.backend.assign(job.id, slots))
            else:
                ok = self._call(job, "start", lambda: self.backend.start(self._launch(job), slots))
            if not ok:
                self._fail(job, now, "the backend could not start the job")
                return ()
            self.store.update_job(
                job.id,
                now,
                slots=slots,
                state=JobState.RUNNING,
                generation=job.generation + 1,
                started_at=job.started_at if resumed else now,
                reason=f"running on {len(slots)} slot(s)",
                event=Event(
                    "resumed" if resumed else "started",
                    f"{len(slots)} worker(s)",
                    {"workers": len(slots)},
                ),
            )
        elif not slots:
            if not self._call(job, "assign", lambda: self.backend.assign(job.id, ())):
                return job.slots
            self.store.update_job(
                job.id,
                now,
                slots=(),
                state=JobState.QUEUED,
                rescale_started_at=None,
                reason="preempted: its slots went to other jobs",
                event=Event("preempted", f"{old} → 0 worker(s)", {"from": old, "to": 0}),
            )
        else:
            if not self._call(job, "assign", lambda: self.backend.assign(job.id, slots)):
                return job.slots
            self.metrics.rescales.inc()
            self.store.update_job(
                job.id,
                now,
                slots=slots,
                state=JobState.RESCALING,
                generation=job.generation + 1,
                rescale_started_at=now,
                reason=f"rescaling {old} → {len(slots)} worker(s)",
                event=Event(
                    "rescale", f"{old} → {len(slots)} worker(s)", {"from": old, "to": len(slots)}
                ),
            )
        return slots

    def job_dir(self, job_id: str) -> Path:
        """Where the job's logs (and, by default, checkpoints) live."""
        return self.data_dir / "jobs" / job_id

    def log_paths(self, job_id: str) -> dict[int, Path]:
        """Each worker's log by worker id: what the backend reports, and the files left in
        the job's log dir (so logs stay readable after the backend forgot the job)."""
        found: dict[int, Path] = {}
        log_dir = self.job_dir(job_id) / "logs"
        if log_dir.is_dir():
            for path in log_dir.glob("worker-*.log"):
                number = path.stem.removeprefix("worker-")
                if number.isdigit():
                    found[int(number)] = path
        try:
            found.update(self.backend.log_paths(job_id))
        except Exception:
            log.exception("backend log_paths failed for %s", job_id)
        return found

    def _launch(self, job: JobRecord) -> JobLaunch:
        spec = self._spec(job)
        root = self.job_dir(job.id)
        working_dir = Path(spec.working_dir) if spec.working_dir else None
        checkpoint_dir = root / "checkpoints"
        if spec.checkpoint_dir:
            # Relative to the job's working directory, like the paths in its command.
            checkpoint_dir = (working_dir or Path()) / spec.checkpoint_dir
        return JobLaunch(
            job_id=job.id,
            argv=tuple(spec.command),
            env={**spec.env, "TIDAL_JOB_ID": job.id},
            working_dir=working_dir,
            log_dir=root / "logs",
            checkpoint_dir=checkpoint_dir,
            checkpoint_every_steps=spec.checkpoint_every_steps,
            checkpoint_every_seconds=spec.checkpoint_every_seconds,
            cpus=spec.resources.cpus,
            memory=spec.resources.memory,
            gpu=self.cluster.gpu and spec.resources.gpus > 0,
        )

    def _spec(self, job: JobRecord) -> JobSpec:
        spec = self._specs.get(job.id)
        if spec is None:
            spec = self._specs[job.id] = job.spec
        return spec

    def _call(self, job: JobRecord, what: str, action: Callable[[], None]) -> bool:
        try:
            action()
        except Exception as exc:
            log.exception("backend %s failed for %s", what, job.id)
            self.store.add_event(job.id, "backend_error", f"{what}: {type(exc).__name__}: {exc}")
            return False
        return True

    def _note_policy_error(self, message: str) -> None:
        # Keyed "" (no job): the same error every tick is one event until it changes.
        if self._noted.get("") != message:
            self._noted[""] = message
            self.store.add_event(None, "policy_error", message)

    def _note(self, job: JobRecord, message: str) -> None:
        if self._noted.get(job.id) != message:
            self._noted[job.id] = message
            self.store.add_event(job.id, "waiting", message)

    def _refresh_gauges(self, held: Mapping[str, tuple[Slot, ...]]) -> None:
        for state, n in self.store.count_by_state().items():
            self.metrics.jobs.labels(state=state.value).set(n)
        self.metrics.slots_used.set(sum(len(slots) for slots in held.values()))
