"""A role's replicas as plain processes: one per slot, each started with the environment
its launcher gives it (``tf``, ``mpi``, ``ps``), no rescale protocol.

A :class:`ReplicaSet` starts a replica on every assigned slot and reports each exit; it
never restarts a replica by itself. A replica that failed waits for its slot to be
assigned again (the controller's decision, :mod:`tidal.policy.role_restart`); one that
finished with 0 is done, unless the role's policy is ``Always``, where a finished replica
is reported like a failed one so that the controller restarts it within the budget; one
that failed under ``Never`` stays down. A slot that leaves the assignment has its replica
stopped (SIGTERM, then SIGKILL after the grace): an elastic ``ps`` worker leaves so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from tidal.launch.groups.api import GroupEvent, Outcome
from tidal.launch.groups.role_slots import replica_indices
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
    wait_for_exit,
    worker_env,
)
from tidal.policy.role_restart import respawns

__all__ = ["ReplicaEnv", "ReplicaSet"]

log = logging.getLogger("tidal.launch")

#: ``(slot, index) -> variables`` a replica gets from its launcher, on top of the job's.
ReplicaEnv = Callable[[str, int], dict[str, str]]
#: Seconds a replica gets between SIGTERM and SIGKILL when its slot is taken away.
_LEAVE_GRACE = 10.0


class ReplicaSet:
    """Run one role's replicas as plain processes (see the module docstring)."""

    def __init__(
        self,
        spec: WorkerSpec,
        *,
        policy: str = "OnFailure",
        env_for: ReplicaEnv | None = None,
        on_output: Callable[[str, str], None] | None = None,
        on_event: Callable[[GroupEvent], None] | None = None,
        spawner: Spawner | None = None,
        store: str = "",
        ids: WorkerIds | None = None,
    ) -> None:
        """``policy``: the role's restart policy; ``env_for``: the launcher's variables
        for a replica; ``store``: the job's store address (``TIDAL_STORE``)."""
        self.spec = spec
        self.policy = policy
        self.spawner: Spawner = spawner or LocalSpawner()
        self.ids = ids or WorkerIds()
        self.workers: dict[str, Worker] = {}
        self.desired: list[str] = []
        #: Each assigned slot's replica index (stable while the slot stays assigned).
        self.indices: dict[str, int] = {}
        self.outcome: Outcome | None = None
        self._env_for = env_for
        self._on_output = on_output
        self._on_event = on_event
        self._store = store
        #: Slots whose replica exited and waits for the slot to be assigned again.
        self._held_back: set[str] = set()
        #: Slots whose replica is over for good (finished with 0, or failed under Never).
        self._over: set[str] = set()
        self._log_files: list[RotatingLog] = []
        self._leaving_since: dict[str, float] = {}

    @property
    def role(self) -> str:
        """The role's name."""
        return self.spec.role

    def start(self, slots: Sequence[str]) -> None:
        """Start one replica per slot."""
        self.assign(slots)

    def assign(self, slots: Sequence[str]) -> None:
        """Run on exactly ``slots``: replicas on dropped slots are stopped, new slots get a
        replica, and a slot whose replica failed gets a new one (the restart)."""
        if len(set(slots)) != len(slots):
            raise ValueError(f"slots: each slot at most once, got {list(slots)}")
        self.desired = list(slots)
        self.indices = replica_indices(self.desired, self.indices)
        self._held_back.clear()

    def poll_interval(self) -> float:
        """How long a caller may wait before the next :meth:`poll`."""
        return 0.05

    def settled(self) -> bool:
        """Whether a replica runs on every assigned slot not over, and on no other (a
        replica that exited and waits for its slot to be assigned again: not settled)."""
        live = {w.slot for w in self.live()}
        return not self._held_back and live == set(self.desired) - self._over

    def live(self) -> list[Worker]:
        """Replicas whose process has not exited."""
        return [w for w in self.workers.values() if w.phase is not WorkerPhase.EXITED]

    @property
    def succeeded(self) -> bool:
        """Every assigned slot's replica finished with 0 and none runs."""
        return bool(self.desired) and set(self.desired) <= self._over_ok() and not self.live()

    def _over_ok(self) -> set[str]:
        return {
            w.slot
            for w in self.workers.values()
            if w.phase is WorkerPhase.EXITED and w.exit_code == 0 and not w.killed and not w.failed
        }

    def poll(self) -> Outcome | None:
        """Reap exits, stop replicas of dropped slots, start replicas on assigned slots."""
        if self.outcome is not None:
            return self.outcome
        self._reap()
        self._reconcile()
        if self.succeeded:
            self.outcome = Outcome.SUCCEEDED
        return self.outcome

    def _reap(self) -> None:
        for worker in self.live():
            code = worker.process.poll()
            if code is None:
                continue
            worker.phase, worker.exit_code = WorkerPhase.EXITED, code
            self._leaving_since.pop(worker.id, None)
            name = f"{worker.id} ({self.role}[{worker.index}])"
            if worker.killed:
                self._emit("released", f"{name} stopped (status {code})")
            elif code == 0 and not respawns(self.policy, code):
                self._over.add(worker.slot)
                self._emit("finished", f"{name} finished")
            else:
                worker.failed = True
                if respawns(self.policy, code):
                    self._held_back.add(worker.slot)
                else:
                    self._over.add(worker.slot)
                message = f"{name} on slot {worker.slot} exited with status {code}"
                self._emit(
                    "failed", worker.failed_with(message, self.spec.log_dir, self.spec.memory)
                )

    def _reconcile(self) -> None:
        occupied = {w.slot: w for w in self.live()}
        for slot, worker in occupied.items():
            if slot in self.desired:
                continue
            since = self._leaving_since.get(worker.id)
            if since is None:
                self._leaving_since[worker.id] = time.monotonic()
                worker.killed = True
                worker.process.terminate()
            elif time.monotonic() - since > _LEAVE_GRACE:
                worker.process.kill()
        for slot in self.desired:
            if slot in occupied or slot in self._held_back or slot in self._over:
                continue
            self._spawn(slot)

    def _spawn(self, slot: str) -> Worker:
        worker_id = self.ids.take()
        index = self.indices[slot]
        peers = [self._store.rsplit(":", 1)[0]] * len(self.desired)
        env = worker_env(self.spec, worker_id=worker_id, slot=slot, store=self._store, peers=peers)
        if self._env_for is not None:
            env.update(self._env_for(slot, index))
        process = spawn_logged(
            self.spawner,
            self.spec,
            worker_id=worker_id,
            slot=slot,
            env=env,
            on_output=self._on_output,
            files=self._log_files,
        )
        # No readiness protocol: a plain replica runs once started.
        worker = Worker(
            worker_id, slot, process, phase=WorkerPhase.MEMBER, role=self.role, index=index
        )
        self.workers[worker_id] = worker
        self._emit(
            "started",
            f"{worker_id} ({self.role}[{index}]) started on slot {slot} (pid {process.pid})",
        )
        return worker

    def fail(self, reason: str) -> None:
        """End the role as failed: kill every replica."""
        if self.outcome is None:
            self._emit("failed", reason)
            self.outcome = Outcome.FAILED
            kill_workers(self.workers.values())

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM every replica, wait up to ``grace`` seconds, SIGKILL what is left;
        close the logs."""
        live = self.live()
        for worker in live:
            worker.killed = True
            worker.process.terminate()
        wait_for_exit(live, grace)
        kill_workers(self.workers.values())
        if self.outcome is None:
            self.outcome = Outcome.STOPPED
        close_outputs(self.workers.values(), self._log_files)

    def _emit(self, kind: str, message: str) -> None:
        log.info("run=%s %s: %s", self.spec.job_id, kind, message)
        if self._on_event is not None:
            self._on_event(GroupEvent(kind, message))
