"""The one loop that drives a job's group for a backend: a :class:`~tidal.launch.groups.api.
JobGroup` (:func:`~tidal.launch.launchers.make_group`'s group for the job's launcher, or
:class:`~tidal.launch.groups.roles.RoleGroups` for a multi-role job).

Every backend runs a job the same way: apply the controller's latest slots, poll the group,
report the job's :class:`~tidal.launch.api.JobStatus` and the workers' report batches,
and stop when told to or when the group ended. Only where the orders come from and where
the status goes differ (the local backend's agent process talks through the job's store;
the Ray backend's thread through memory): that is a :class:`JobControl`. The group sees
its slots by name (``host:i``, :mod:`tidal.launch.slot_names`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from tidal.launch.api import JobStatus, RoleLaunch, WorkerState, WorkerStatus
from tidal.launch.endpoints import SlotNetwork
from tidal.launch.groups.api import GroupEvent, JobGroup, Outcome
from tidal.launch.groups.base import GroupOptions
from tidal.launch.groups.role_slots import group_replicas
from tidal.launch.groups.roles import RoleGroups
from tidal.launch.launchers import make_group
from tidal.launch.process import Spawner
from tidal.launch.slot_names import status_slots
from tidal.launch.worker import Worker, WorkerPhase, WorkerSpec, worker_number
from tidal.runtime.env import EXIT_RELEASED
from tidal.runtime.rendezvous import ReportQueue
from tidal.runtime.report import REPORT_PREFIX

__all__ = ["GroupDriver", "JobControl", "worker_state"]

log = logging.getLogger("tidal.launch")

#: Seconds between reads of the workers' report queue (they flush about once a second).
_REPORT_INTERVAL = 0.25


def worker_state(worker: Worker) -> WorkerState:
    """A group's worker as a backend reports it."""
    if worker.phase is not WorkerPhase.EXITED:
        running = worker.phase in (WorkerPhase.MEMBER, WorkerPhase.LEAVING)
        return WorkerState.RUNNING if running else WorkerState.STARTING
    if worker.failed:
        return WorkerState.FAILED
    if worker.exit_code == 0:
        return WorkerState.EXITED
    if worker.exit_code == EXIT_RELEASED or worker.killed or worker.left:
        return WorkerState.RELEASED  # a worker the group stopped itself did not fail
    return WorkerState.FAILED


class JobControl(Protocol):
    """Where a driven job's orders come from and where its status goes."""

    def requests(self) -> tuple[Sequence[str] | None, bool]:
        """Slots newly asked for (``None``: no change since the last call), and whether
        the job is to stop."""
        ...

    def publish(self, status: JobStatus, ended: bool, reports: list[dict[str, Any]]) -> None:
        """The job as of now (``ended``: its group is over, this is the last call) and the
        report batches the workers sent since the previous call, oldest first."""
        ...


class GroupDriver:
    """One job's group, driven for a backend: see the module docstring."""

    def __init__(
        self,
        job_id: str,
        spec: WorkerSpec,
        *,
        spawner: Spawner | None = None,
        store_host: str = "127.0.0.1",
        stop_grace: float = 30.0,
        first_worker_id: int = 0,
        roles: Sequence[RoleLaunch] = (),
        work_dir: Path | None = None,
        network: SlotNetwork | None = None,
        on_output: Callable[[str, str], None] | None = None,
        on_event: Callable[[GroupEvent], None] | None = None,
        on_failure: Callable[[Worker], None] | None = None,
    ) -> None:
        """``stop_grace``: how long released workers get to leave when the job stops
        (rank 0 checkpoints first); ``first_worker_id``: see :class:`WorkerGroup`;
        ``roles``: a multi-role job's roles, run as :class:`RoleGroups` (launcher files
        in ``work_dir``, replicas reached as ``network`` says) instead of one group of
        ``spec``. ``on_output``, ``on_event`` and ``on_failure`` hear of the workers'
        output lines, the group's events and each failed worker (``tidal run`` shows the
        first two and decides on restarts from the third)."""
        self.job_id = job_id
        self._on_event_hook = on_event
        self.stop_grace = stop_grace
        # The roles of a multi-role job are split into workers by RoleGroups itself.
        self.replica_slots = 1 if roles else spec.replica_slots
        self._replicas: list[str] = []
        self.group: JobGroup
        options: GroupOptions = {
            "on_output": on_output,
            "on_event": self._on_event,
            "on_failure": on_failure,
            "spawner": spawner,
            "store_host": store_host,
            "first_worker_id": first_worker_id,
        }
        if roles:
            self.group = RoleGroups(spec, roles, work_dir=work_dir, network=network, **options)
        else:
            self.group = make_group(spec, **options)
        self._reports = ReportQueue(self.group.host.store, REPORT_PREFIX)
        self._last_read = 0.0
        self._last_failure = ""
        self._error = ""

    def _on_event(self, event: GroupEvent) -> None:
        if event.kind == "failed":
            self._last_failure = event.message
        if self._on_event_hook is not None:
            self._on_event_hook(event)

    def status(self) -> JobStatus:
        """The job's workers and outcome as of the last poll (metrics and goodput are
        left to the caller: see :meth:`take_reports`)."""
        group = self.group
        workers = tuple(
            WorkerStatus(
                worker_id=worker_number(w.id),
                **status_slots(w.slot),
                state=worker_state(w),
                pid=w.process.pid,
                exit_code=w.exit_code,
                role=w.role,
                index=w.index,
                cause=w.cause,
            )
            for w in group.workers.values()
        )
        failed = group.outcome is Outcome.FAILED or bool(self._error)
        reason = ""
        if failed:
            reason = self._error or self._last_failure or "failed"
        return JobStatus(
            job_id=self.job_id,
            generation=group.generation.number if group.generation else -1,
            workers=workers,
            finished=group.outcome is Outcome.SUCCEEDED and not self._error,
            failed=failed,
            reason=reason,
        )

    def take_reports(self, *, read: bool = False) -> list[dict[str, Any]]:
        """The report batches (:mod:`tidal.runtime.report`) the workers sent since the last
        call, oldest first. Reads the job's store at most a few times a second, unless
        ``read`` (say, once the job ended)."""
        now = time.monotonic()
        if not read and now - self._last_read < _REPORT_INTERVAL:
            return []
        self._last_read = now
        try:
            raw = self._reports.drain()
        except Exception as exc:  # a report is never worth failing the job for
            log.debug("job=%s reading reports: %s", self.job_id, exc)
            return []
        batches = []
        for text in raw:
            try:
                batches.append(dict(json.loads(text)))
            except (ValueError, TypeError):
                log.debug("job=%s: malformed report skipped", self.job_id)
        return batches

    def _as_replicas(self, slots: Sequence[str]) -> list[str]:
        """One group's slots as its workers' (a worker of several GPUs holds several)."""
        if self.replica_slots == 1:
            return list(slots)
        self._replicas = group_replicas(slots, self.replica_slots, self._replicas)
        return self._replicas

    def start(self, slots: Sequence[str]) -> None:
        """Start the group on ``slots`` (one name a slot)."""
        self.group.start(self._as_replicas(slots))

    def assign(self, slots: Sequence[str]) -> None:
        """Move the group to ``slots`` (one name a slot) at its next step boundary."""
        self.group.assign(self._as_replicas(slots))

    def drive(self, control: JobControl) -> JobStatus:
        """Run the job until it ends or ``control`` stops it; returns the final status
        (also published). An error in the group fails the job with that reason."""
        group = self.group
        try:
            while True:
                slots, stopping = control.requests()
                if stopping:
                    group.stop(grace=self.stop_grace)
                    break
                if slots is not None:
                    self.assign(slots)
                outcome = group.poll()
                control.publish(self.status(), False, self.take_reports())
                if outcome is not None:
                    group.stop(grace=0)  # closes the log files; the workers are gone
                    break
                time.sleep(group.poll_interval())
        except Exception as exc:
            log.exception("job=%s: the group failed", self.job_id)
            self._error = f"backend error: {type(exc).__name__}: {exc}"
            try:
                group.stop(grace=0)
            except Exception:
                log.exception("job=%s: stopping the group failed", self.job_id)
        final = self.status()
        control.publish(final, True, self.take_reports(read=True))
        return final
