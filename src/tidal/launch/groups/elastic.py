"""One elastic job's workers, driven through generations.

:class:`WorkerGroup` is the launcher half of the rescale protocol: it hosts the job's
rendezvous store, starts workers on slots, admits newcomers only once they are ready (built
their model), publishes a generation for every change (grow, planned shrink, failure,
restart from checkpoint). It decides nothing about *how many* slots a job should have,
nor whether a failed worker is replaced: ``assign`` says that. A slot whose worker failed
gets a new worker only once it is assigned again (after :func:`~tidal.policy.restart.
decide_restart` said so). ``tidal run`` and the backends drive it (through
:mod:`tidal.launch.driver`); a :class:`~tidal.launch.process.Spawner` says where the
processes run (subprocesses here by default; Ray actors for that backend).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tidal.launch.groups.api import Outcome
from tidal.launch.groups.base import GroupBase
from tidal.launch.worker import Worker, WorkerPhase, WorkerSpec, wait_for_exit, worker_env
from tidal.runtime.env import EXIT_RELEASED
from tidal.runtime.rendezvous import Generation

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from tidal.launch.groups.base import GroupBaseOptions

__all__ = ["WorkerGroup"]

log = logging.getLogger("tidal.launch")


class WorkerGroup(GroupBase):
    """Run and resize one job's workers. Call :meth:`poll` regularly (every few ms)."""

    def __init__(self, spec: WorkerSpec, **options: Unpack[GroupBaseOptions]) -> None:
        """The options of :class:`~tidal.launch.groups.base.GroupBase`."""
        super().__init__(spec, **options)
        #: Slots whose worker failed since they were last assigned: no new worker there
        #: until an :meth:`assign` lists them again (the restart decision is the caller's).
        self._held_back: set[str] = set()
        self._forming_since: float | None = None
        self._finishing = False
        self._finishing_since = 0.0
        #: A member returned 0: training is over, so workers still waiting to be admitted
        #: hold nothing and one that does not leave in time is killed. (A worker that
        #: returns 0 without ever joining, a plain program, finished its own work only:
        #: its peers are left to finish theirs.)
        self._training_done = False
        self._failed_while_finishing = False
        #: When each leaving worker was first seen leaving (for the bound on its exit).
        self._leaving_since: dict[str, float] = {}

    # -- what callers ask -------------------------------------------------------------

    def start(self, slots: Sequence[str]) -> None:
        """Start one worker per slot; they form generation 0 once all are ready."""
        self.assign(slots)

    def assign(self, slots: Sequence[str]) -> None:
        """Make the job run on exactly ``slots``: workers on slots that stay keep going,
        the others are released at their next step boundary, newcomers start on new slots
        and are admitted once ready; a listed slot whose worker failed gets a new one. An
        empty list releases every worker (the job checkpoints and waits)."""
        super().assign(slots)
        self._held_back.clear()

    def settled(self) -> bool:
        """Whether the workers run exactly on the assigned slots (no change in flight)."""
        return self._forming_since is None and sorted(self.member_slots()) == sorted(self.desired)

    # -- the state machine ------------------------------------------------------------

    def poll(self) -> Outcome | None:
        """Advance: reap exits, handle failures, admit and release. Returns the outcome
        once the job has ended."""
        if self.outcome is not None:
            return self.outcome
        self._reap()
        if self.outcome is None:
            self._check_formation()
        if self.outcome is None and not self._finishing:
            self._reconcile()
        return self.outcome

    def _reap(self) -> None:
        members = set(self.members)
        lost: list[str] = []
        for worker, was, code in self._exits():
            if code == 0 and worker.id in members:
                self._finish(training=True)
                self._emit("finished", f"{worker.id} finished")
            elif (
                code == 0 and was in (WorkerPhase.STARTING, WorkerPhase.READY) and not worker.killed
            ):
                # Its program returned without using tidal: that worker is done, and the
                # job succeeds once every other worker is done too (never respawned).
                self._finish(training=False)
                self._emit("finished", f"{worker.id} on slot {worker.slot} finished")
            elif code == EXIT_RELEASED and was in (WorkerPhase.LEAVING, WorkerPhase.MEMBER):
                worker.left = True
                self._emit("released", f"{worker.id} released from slot {worker.slot}")
            elif was is WorkerPhase.LEAVING:
                worker.left = True
                self._emit("released", f"{worker.id} left with status {code}")
            elif self._finishing and (code != 0 and not worker.killed):
                self._failed_while_finishing = True
                self._emit(
                    "failed", f"{worker.id} exited with status {code} after the job finished"
                )
            elif worker.killed:
                self._emit("released", f"{worker.id} stopped before it was admitted")
            else:
                message = f"{worker.id} on slot {worker.slot} exited with status {code}"
                self._emit(
                    "failed", worker.failed_with(message, self.spec.log_dir, self.spec.memory)
                )
                worker.failed = True
                self._held_back.add(worker.slot)
                if worker.id in members:
                    lost.append(worker.id)
                if self._on_failure is not None:
                    self._on_failure(worker)
        if self._finishing:
            if self._training_done:
                # Training is over: a newcomer still waiting to be admitted holds nothing.
                for worker in self.workers.values():
                    if not worker.trained and worker.phase is not WorkerPhase.EXITED:
                        self._kill(worker)
                        worker.phase = WorkerPhase.EXITED
            alive = [w for w in self.workers.values() if w.phase is not WorkerPhase.EXITED]
            overdue = time.monotonic() - self._finishing_since > 3 * self.spec.timeout + 30
            if alive and self._training_done and overdue:
                for worker in alive:
                    log.warning(
                        "worker=%s still running after the job finished: killing", worker.id
                    )
                    self._kill(worker)
                    worker.phase = WorkerPhase.EXITED
                alive = []
            if not alive:
                failed = self._failed_while_finishing
                self.outcome = Outcome.FAILED if failed else Outcome.SUCCEEDED
                self._kill_all()
            return
        if lost:
            self._handle_loss(lost)

    def _finish(self, *, training: bool) -> None:
        if not self._finishing:
            self._finishing, self._finishing_since = True, time.monotonic()
        if training and not self._training_done:
            self._training_done, self._finishing_since = True, time.monotonic()

    def _handle_loss(self, lost: list[str]) -> None:
        survivors = [
            m
            for m in self.members
            if m not in lost and self.workers[m].phase is not WorkerPhase.EXITED
        ]
        ready = self._ready_newcomers()
        if survivors:
            self._publish(survivors + ready, reason="failure", lost=lost)
        else:
            # Nobody holds the state in memory: the next generation resumes from the
            # latest durable checkpoint. Fresh workers start once the slots are assigned.
            self._emit("restarted", "no survivor: the next workers resume from the checkpoint")
            self.generation = Generation(
                self.generation.number if self.generation else -1, (), reason="failure"
            )
            self._forming_since = None

    def _check_formation(self) -> None:
        if self._forming_since is None or self.generation is None or self._finishing:
            return
        pending = []
        for m in self.members:
            if self.host.is_formed(self.generation.number, m):
                self.workers[m].trained = True
            else:
                pending.append(m)
        if not pending:
            stall = time.monotonic() - self._forming_since
            self._forming_since = None
            self._emit(
                "generation",
                f"generation {self.generation.number} formed with {self.world_size} workers",
                stall=stall,
            )
            return
        if time.monotonic() - self._forming_since > 3 * self.spec.timeout + 30:
            for m in pending:
                log.warning("worker=%s did not join gen=%d: killing", m, self.generation.number)
                self._kill(self.workers[m], failed=True)

    def _ready_newcomers(self) -> list[str]:
        ready = []
        for worker in self.workers.values():
            if worker.phase is WorkerPhase.STARTING and self.host.is_ready(worker.id):
                worker.phase = WorkerPhase.READY
            if worker.phase is WorkerPhase.READY and worker.slot in self.desired:
                ready.append(worker.id)
        return ready

    def _reconcile(self) -> None:
        occupied = {
            w.slot: w
            for w in self.workers.values()
            if w.phase in (WorkerPhase.STARTING, WorkerPhase.READY, WorkerPhase.MEMBER)
        }
        # A slot is handed on only once its previous holder exited (two processes on one
        # GPU otherwise): a leaver's exit is reaped by the next poll, which spawns then.
        # Bounded: a leaver that does not leave in time is killed (and reaped by _kill).
        leaving = set()
        for w in self.workers.values():
            if w.phase is not WorkerPhase.LEAVING:
                continue
            since = self._leaving_since.setdefault(w.id, time.monotonic())
            if time.monotonic() - since > 3 * self.spec.timeout + 30:
                log.warning("worker=%s did not leave slot %s in time: killing", w.id, w.slot)
                self._kill(w)
                w.phase = WorkerPhase.EXITED
            else:
                leaving.add(w.slot)
        for slot in self.desired:
            if slot not in occupied and slot not in self._held_back and slot not in leaving:
                self._spawn(slot)
        for worker in list(occupied.values()):
            if worker.slot not in self.desired and worker.phase is not WorkerPhase.MEMBER:
                self._kill(worker)  # never admitted: nothing to hand over
        if self._forming_since is not None:
            return
        members = list(self.members)
        leavers = [m for m in members if self.workers[m].slot not in self.desired]
        ready = self._ready_newcomers()
        first = not members
        if first:
            waiting = [
                w
                for w in self.workers.values()
                if w.phase is WorkerPhase.STARTING and w.slot in self.desired
            ]
            if waiting or not ready or self._held_back & set(self.desired):
                return  # a (re)start forms once every worker is built
        elif not leavers and not ready:
            return
        stay = [m for m in members if m not in leavers]
        reason = "resize"
        if first:
            reason = "start" if self.generation is None else "restart"
        elif not stay and not ready:
            reason = "release"
        self._publish(stay + ready, reason=reason)
        for m in leavers:
            self.workers[m].phase = WorkerPhase.LEAVING

    def _publish(self, members: list[str], *, reason: str, lost: Sequence[str] = ()) -> None:
        number = (self.generation.number if self.generation else -1) + 1
        self.generation = Generation(number, tuple(members), reason=reason, lost=tuple(lost))
        self.host.publish(self.generation)
        for m in members:
            self.workers[m].phase = WorkerPhase.MEMBER
        self._forming_since = time.monotonic() if members else None
        ranks = self._ranks(members)
        self._emit("generation", f"generation {number} ({reason}): {len(members)} workers: {ranks}")

    # -- processes ----------------------------------------------------------------------

    def _spawn(self, slot: str) -> Worker:
        worker_id = self.ids.take()
        # The group's slots are on the store's machine: each peer is reached there.
        peers = [self.store_host] * len(self.desired)
        env = worker_env(
            self.spec, worker_id=worker_id, slot=slot, store=self.host.address, peers=peers
        )
        return self._spawn_worker(slot, env, worker_id=worker_id, phase=WorkerPhase.STARTING)

    def _kill(self, worker: Worker, *, failed: bool = False) -> None:
        """SIGKILL the worker's process group. ``failed`` marks a worker killed for not
        doing its part (it counts as a failure); otherwise it was merely not needed."""
        worker.killed = not failed
        if worker.process.poll() is None:
            worker.process.kill()
        worker.process.wait(timeout=10)
        worker.exit_code = worker.process.returncode
        if worker.phase is not WorkerPhase.MEMBER:
            worker.phase = WorkerPhase.EXITED

    def stop(self, grace: float = 30.0) -> None:
        """Release every worker (rank 0 checkpoints first), wait up to ``grace`` seconds
        for them to leave, then kill what is left. Closes the store and the logs."""
        for worker in self.workers.values():
            if worker.phase in (WorkerPhase.STARTING, WorkerPhase.READY):
                self._kill(worker)  # never admitted: it holds nothing, and would not leave
        if self.outcome is None and self.members and self._forming_since is None:
            self._publish([], reason="release")
            for m in self.generation.members if self.generation else ():
                self.workers[m].phase = WorkerPhase.LEAVING
            wait_for_exit(list(self.workers.values()), grace)
        self._stopped()
