"""What the controller loop's modules share: backend calls that must not end a tick when
they fail, events for conditions that last, and each job's model, parsed once.

A condition that lasts (a job waiting for slots, a policy that keeps failing) is one event
when it starts or changes, not one event a tick.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from tidal.backends.base import Backend
from tidal.controller.prometheus import ControllerMetrics
from tidal.controller.store.jobs import JobRecord, JobStore
from tidal.controller.store.outage import outage_of
from tidal.model import Job

__all__ = ["LoopEffects"]

log = logging.getLogger(__name__)

#: The key of conditions of the controller itself rather than of one job.
_CONTROLLER = ""


class LoopEffects:
    """The store, the backend and the metrics the loop's modules act on, with the last
    condition noted per job."""

    def __init__(self, store: JobStore, backend: Backend, metrics: ControllerMetrics) -> None:
        self.store = store
        self.backend = backend
        self.metrics = metrics
        self._noted: dict[str, str] = {}
        # A job's spec never changes after submission (its priority and, once workers were
        # stopped, its bounds are the record's): parsing each one once keeps ticks cheap.
        self._specs: dict[str, Job] = {}
        self._unloadable: set[str] = set()
        #: Jobs whose failed workers wait out a crash loop's back-off: when they start
        #: again. Kept in memory: a restarted controller requeues its jobs anyway.
        self.restart_at: dict[str, float] = {}

    def model(self, job: JobRecord) -> Job:
        """The job model of ``job``."""
        found = self._specs.get(job.id)
        if found is None:
            found = self._specs[job.id] = job.job
        if found.priority != job.priority or found.slot_range.max > job.max_slots:
            found = self._specs[job.id] = job.job
        return found

    def loadable(self, job: JobRecord) -> bool:
        """Whether ``job``'s model can be built from its stored spec; one that cannot (a
        spec no release would have accepted: the row was edited) is logged once and left
        alone, so it does not stop the loop for every other job."""
        try:
            self.model(job)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            if job.id not in self._unloadable:
                self._unloadable.add(job.id)
                log.warning("job %s: stored spec cannot be read, left alone: %s", job.id, exc)
            return False
        return True

    def forget_models(self, keep: Collection[str]) -> None:
        """Drop the parsed models of jobs not in ``keep`` (they ended)."""
        self._specs = {k: v for k, v in self._specs.items() if k in keep}
        self.restart_at = {k: v for k, v in self.restart_at.items() if k in keep}

    def call(self, job_id: str, what: str, action: Callable[[], None]) -> bool:
        """Run a backend call for ``job_id``; a failure becomes a ``backend_error`` event
        and ``False``, never an exception that ends the tick, except an outage (the data
        dir's disk full: a launch file could not be written), which is no fault of the
        job's: it ends the tick, and the call is made again once the loop recovers."""
        try:
            action()
        except Exception as exc:
            if outage_of(exc) is not None:
                raise
            log.exception("backend %s failed for %s", what, job_id)
            self.store.add_event(job_id, "backend_error", f"{what}: {type(exc).__name__}: {exc}")
            return False
        return True

    def note_waiting(self, job_id: str, message: str) -> None:
        """Record that ``job_id`` waits (a ``waiting`` event), once per distinct message."""
        if self._noted.get(job_id) != message:
            self._noted[job_id] = message
            self.store.add_event(job_id, "waiting", message)

    def note_policy_error(self, message: str) -> None:
        """Record that the policy failed (a ``policy_error`` event), once per message."""
        if self._noted.get(_CONTROLLER) != message:
            self._noted[_CONTROLLER] = message
            self.store.add_event(None, "policy_error", message)

    def clear(self, job_id: str | None = None) -> None:
        """Forget the condition of ``job_id`` (of the controller itself when ``None``): it
        ended, so the next one is news again."""
        self._noted.pop(_CONTROLLER if job_id is None else job_id, None)
        if job_id is not None:
            # Its slots change now: new workers start, whatever a back-off waited for.
            self.restart_at.pop(job_id, None)
