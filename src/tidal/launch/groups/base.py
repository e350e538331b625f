"""What the two launchers' groups share: their workers' processes, logs and events.

:class:`~tidal.launch.groups.elastic.WorkerGroup` (the rescale protocol) and
:class:`~tidal.launch.groups.torchrun.TorchrunGroup` (restart-based) differ in how they
change a running group; they keep the same books: the job's store, the assigned slots, one
:class:`~tidal.launch.worker.Worker` per process started (numbered from
:class:`~tidal.launch.worker.WorkerIds`), each process's output in its log file, every
change told as a :class:`~tidal.launch.groups.api.GroupEvent`. :class:`GroupBase` keeps
them.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import TypedDict

from tidal.launch.groups.api import GroupEvent, Outcome
from tidal.launch.log_sink import RotatingLog
from tidal.launch.process import LocalSpawner, Spawner
from tidal.launch.worker import (
    Worker,
    WorkerIds,
    WorkerPhase,
    WorkerSpec,
    close_outputs,
    kill_workers,
    spawn_logged,
)
from tidal.runtime.rendezvous import Generation, RendezvousHost

__all__ = ["GroupBase", "GroupBaseOptions", "GroupOptions"]

log = logging.getLogger("tidal.launch")


class GroupOptions(TypedDict, total=False):
    """How a job's group is built, whatever its kind (see :class:`GroupBase`)."""

    on_output: Callable[[str, str], None] | None
    on_event: Callable[[GroupEvent], None] | None
    on_failure: Callable[[Worker], None] | None
    spawner: Spawner | None
    store_host: str
    first_worker_id: int


class GroupBaseOptions(GroupOptions, total=False):
    """The keyword arguments of a launcher's group: :class:`GroupOptions`, and where its
    worker numbers come from when it is one role's group of several."""

    ids: WorkerIds | None


class GroupBase(ABC):
    """The books of a group whose workers meet in the job's store; subclasses say how
    the group forms and changes (:meth:`poll`), when it is settled and how it stops."""

    def __init__(
        self,
        spec: WorkerSpec,
        *,
        on_output: Callable[[str, str], None] | None = None,
        on_event: Callable[[GroupEvent], None] | None = None,
        on_failure: Callable[[Worker], None] | None = None,
        spawner: Spawner | None = None,
        store_host: str = "127.0.0.1",
        first_worker_id: int = 0,
        ids: WorkerIds | None = None,
    ) -> None:
        """``first_worker_id``: the number of the first worker started (a restarted agent
        continues after its predecessor's: worker ids are never reused within a job);
        ``ids``: where the numbers come from instead (a multi-role job's groups share one).
        ``on_failure`` hears of every worker that failed (its slot then waits for the
        next :meth:`assign`); ``spawner`` runs the worker processes (subprocesses here by
        default); ``store_host`` is the address workers reach the job's store at."""
        self.spec = spec
        self.spawner: Spawner = spawner or LocalSpawner()
        self.store_host = store_host
        self.host = RendezvousHost(store_host)
        self.workers: dict[str, Worker] = {}
        self.generation: Generation | None = None
        self.desired: list[str] = []
        self.outcome: Outcome | None = None
        self._on_output = on_output
        self._on_event = on_event
        self._on_failure = on_failure
        #: Where worker numbers come from (a multi-role job's groups share one source).
        self.ids = ids if ids is not None else WorkerIds(first_worker_id)
        self._log_files: list[RotatingLog] = []

    # -- what callers ask -------------------------------------------------------------

    @property
    def members(self) -> tuple[str, ...]:
        """Worker ids of the current generation, in rank order."""
        return self.generation.members if self.generation else ()

    @property
    def world_size(self) -> int:
        """Workers in the current generation."""
        return len(self.members)

    def member_slots(self) -> list[str]:
        """Slots of the current generation's workers, in rank order."""
        return [self.workers[m].slot for m in self.members]

    def start(self, slots: Sequence[str]) -> None:
        """Start one worker per slot."""
        self.assign(slots)

    def assign(self, slots: Sequence[str]) -> None:
        """Make the job run on exactly ``slots`` (subclasses say how they get there)."""
        if len(set(slots)) != len(slots):
            raise ValueError(f"slots: each slot at most once, got {list(slots)}")
        self.desired = list(slots)

    @abstractmethod
    def settled(self) -> bool:
        """Whether the workers run exactly on the assigned slots (no change in flight)."""

    @abstractmethod
    def poll(self) -> Outcome | None:
        """Advance the group; the outcome once the job has ended."""

    @abstractmethod
    def stop(self, grace: float = 30.0) -> None:
        """Stop every worker, killing what is left after ``grace`` seconds; then
        :meth:`_stopped`."""

    def poll_interval(self) -> float:
        """How long a caller may wait before the next :meth:`poll`: short while a change
        is in flight, longer once settled (polling costs the workers CPU on small hosts).
        A death is noticed by the workers themselves at once either way."""
        return 0.01 if not self.settled() else 0.05

    def progress(self) -> dict[str, object] | None:
        """Rank 0's last report (step, epoch, generation, world), if its script reports."""
        return self.host.progress()

    # -- processes ----------------------------------------------------------------------

    def _exits(self) -> Iterator[tuple[Worker, WorkerPhase, int]]:
        """Each worker whose process exited since the last poll, marked exited: with
        the phase it was in and its status."""
        for worker in list(self.workers.values()):
            if worker.phase is WorkerPhase.EXITED:
                continue
            code = worker.process.poll()
            if code is None:
                continue
            was = worker.phase
            worker.phase, worker.exit_code = WorkerPhase.EXITED, code
            yield worker, was, code

    def _spawn_worker(
        self, slot: str, env: dict[str, str], *, worker_id: str, phase: WorkerPhase
    ) -> Worker:
        """Start ``worker_id``'s process on ``slot``, its output going to its log file
        and ``on_output``."""
        process = spawn_logged(
            self.spawner,
            self.spec,
            worker_id=worker_id,
            slot=slot,
            env=env,
            on_output=self._on_output,
            files=self._log_files,
        )
        worker = Worker(worker_id, slot, process, phase=phase)
        self.workers[worker_id] = worker
        self._emit("started", f"{worker_id} started on slot {slot} (pid {process.pid})")
        return worker

    def _ranks(self, members: Sequence[str]) -> str:
        """Worker ids are not ranks: which is which (and the pid), for a generation's line."""
        return " ".join(
            f"{rank}={m}(pid {self.workers[m].process.pid})" for rank, m in enumerate(members)
        )

    def _kill_all(self) -> None:
        kill_workers(self.workers.values())

    def fail(self, reason: str) -> None:
        """End the group as failed (the restart budget is spent): kill every worker."""
        if self.outcome is None:
            self._emit("failed", reason)
            self.outcome = Outcome.FAILED
            self._kill_all()

    def _stopped(self) -> None:
        """The end of :meth:`stop`: kill what is left, close the logs."""
        self._kill_all()
        if self.outcome is None:
            self.outcome = Outcome.STOPPED
        close_outputs(self.workers.values(), self._log_files)

    def _emit(self, kind: str, message: str, *, stall: float | None = None) -> None:
        event = GroupEvent(
            kind,
            message,
            generation=self.generation.number if self.generation else None,
            stall=stall,
        )
        log.info("run=%s %s: %s", self.spec.job_id, kind, message)
        if self._on_event is not None:
            self._on_event(event)
