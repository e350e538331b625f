"""A group of workers launched the way ``torchrun`` launches them: restart-based.

:class:`TorchrunGroup` runs a script written for torchrun unchanged: each worker gets the
environment torchrun's agent gives (:mod:`tidal.launch.groups.torchrun_env`) and forms its
process group itself with ``init_process_group()``. The launcher cannot change such a
group while it runs, so, like torchrun's agent, it restarts it:

* **resize**: a new set of slots stops every worker (SIGTERM, SIGKILL after
  ``spec.stop_grace`` seconds), then starts them all again on the new slots, with
  ``TORCHELASTIC_RESTART_COUNT`` one higher and a new store; the script resumes from its
  own checkpoint;
* **failure**: a worker that exits non-zero breaks the incarnation: the others are stopped
  the same way and nothing restarts until the group is assigned its slots again (the
  caller asks :func:`~tidal.policy.restart.decide_restart`, within the restart budget);
* **success**: every worker of the incarnation returned 0.

Like :class:`~tidal.launch.groups.elastic.WorkerGroup` it is a :class:`~tidal.launch.groups.api.
JobGroup`, driven by :class:`~tidal.launch.driver.GroupDriver` (for ``tidal run`` and the
backends): it hosts the job's :class:`~tidal.runtime.rendezvous.RendezvousHost` (for
``tidal resize`` and the report queue) and numbers one :class:`~tidal.runtime.rendezvous.
Generation` per incarnation (by its restart count) for status and logs; what both keep
alike is :class:`~tidal.launch.groups.base.GroupBase`'s.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

import torch.distributed as dist

from tidal.launch.groups.api import Outcome
from tidal.launch.groups.base import GroupBase
from tidal.launch.groups.torchrun_env import TorchrunWorld, torchrun_env
from tidal.launch.worker import Worker, WorkerPhase, WorkerSpec, wait_for_exit
from tidal.runtime.rendezvous import Generation

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from tidal.launch.groups.base import GroupBaseOptions

__all__ = ["TorchrunGroup"]

log = logging.getLogger("tidal.launch")


class TorchrunGroup(GroupBase):
    """Run one job's torchrun-style workers; see the module docstring. Call :meth:`poll`
    regularly."""

    def __init__(self, spec: WorkerSpec, **options: Unpack[GroupBaseOptions]) -> None:
        """The options of :class:`~tidal.launch.groups.base.GroupBase`."""
        super().__init__(spec, **options)
        #: The incarnation's store (``MASTER_ADDR:MASTER_PORT``); a new one per restart.
        self._store: dist.TCPStore | None = None
        #: Restarts of the group so far (``TORCHELASTIC_RESTART_COUNT`` of the next start
        #: is this plus one once a first incarnation ran).
        self.restart_count = -1
        #: When the stop of the incarnation began (SIGTERM sent), while it is stopping.
        self._stopping_since: float | None = None
        self._stop_reason = ""
        #: A worker of the incarnation failed: no restart until the next :meth:`assign`.
        self._broken = False
        #: When the first worker of the incarnation returned 0.
        self._finishing_since: float | None = None
        self._started_at = 0.0

    # -- what callers ask -------------------------------------------------------------

    def assign(self, slots: Sequence[str]) -> None:
        """Make the job run on exactly ``slots``. A set different from the running one
        restarts every worker; after a failure, any assignment (the same slots included)
        starts the group again. No slots stops the workers and waits."""
        super().assign(slots)
        self._broken = False

    def settled(self) -> bool:
        """Whether the incarnation runs exactly on the assigned slots."""
        return (
            self._stopping_since is None
            and not self._broken
            and sorted(self._live_slots()) == sorted(self.desired)
        )

    # -- the state machine ------------------------------------------------------------

    def poll(self) -> Outcome | None:
        """Reap exits, carry a stop forward, start the next incarnation when due. Returns
        the outcome once the job has ended."""
        if self.outcome is not None:
            return self.outcome
        self._reap()
        if self.outcome is None and self._stopping_since is not None:
            self._advance_stop()
        if self.outcome is None and self._stopping_since is None:
            self._reconcile()
        return self.outcome

    def _live(self) -> list[Worker]:
        return [
            self.workers[m] for m in self.members if self.workers[m].phase is not WorkerPhase.EXITED
        ]

    def _live_slots(self) -> list[str]:
        return [w.slot for w in self._live()]

    def _reap(self) -> None:
        members = set(self.members)
        broken_before = self._broken
        failed: list[Worker] = []
        for worker, _, code in self._exits():
            if worker.killed:
                self._emit("released", f"{worker.id} stopped (status {code})")
            elif code == 0:
                if self._finishing_since is None:
                    self._finishing_since = time.monotonic()
                self._emit("finished", f"{worker.id} on slot {worker.slot} finished")
            elif broken_before or worker.id not in members:
                # The incarnation already failed: its other workers' exits (a peer's
                # lost connection) follow from that failure and are not failures.
                worker.killed = True
                self._emit("released", f"{worker.id} left with status {code}")
            else:
                worker.failed = True
                failed.append(worker)
                message = f"{worker.id} on slot {worker.slot} exited with status {code}"
                self._emit(
                    "failed", worker.failed_with(message, self.spec.log_dir, self.spec.memory)
                )
        if failed:
            self._broken = True
            self._finishing_since = None
            for worker in failed:
                if self._on_failure is not None:
                    self._on_failure(worker)
            if self._live():
                self._begin_stop(f"{failed[0].id} failed")
            return
        if self.members and not self._live() and self._finishing_since is not None:
            # Every worker returned 0 (or, its peers done, was stopped after the bound).
            self.outcome = Outcome.SUCCEEDED
            self._emit("finished", f"all {self.world_size} workers finished")
            self._close_incarnation()
            return
        if self._finishing_since is not None and self._live():
            overdue = time.monotonic() - self._finishing_since > 3 * self.spec.timeout + 30
            if overdue:
                for worker in self._live():
                    log.warning("worker=%s still running after its peers finished", worker.id)
                    worker.killed = True
                    worker.process.kill()

    def _reconcile(self) -> None:
        if self._broken or self._finishing_since is not None:
            return
        live = self._live_slots()
        if live and sorted(live) == sorted(self.desired):
            return
        if live:
            self._begin_stop(f"resize to {len(self.desired)} workers")
            return
        if self.desired:
            self._start_incarnation()

    def _begin_stop(self, reason: str) -> None:
        """SIGTERM every live worker of the incarnation; :meth:`_advance_stop` follows."""
        live = self._live()
        for worker in live:
            worker.killed = True
            worker.phase = WorkerPhase.LEAVING
            worker.process.terminate()
        self._stopping_since, self._stop_reason = time.monotonic(), reason
        self._emit(
            "stopping",
            f"{reason}: stopping {len(live)} workers (SIGTERM, SIGKILL after "
            f"{self.spec.stop_grace:g}s); the group restarts from the script's checkpoint",
        )

    def _advance_stop(self) -> None:
        assert self._stopping_since is not None
        live = self._live()
        if not live:
            stall = time.monotonic() - self._stopping_since
            self._stopping_since = None
            self._emit("stopped", f"{self._stop_reason}: every worker stopped", stall=stall)
            self._close_incarnation()
            return
        if time.monotonic() - self._stopping_since > self.spec.stop_grace:
            for worker in live:
                if worker.phase is not WorkerPhase.EXITED:
                    log.warning("worker=%s did not stop in time: killing", worker.id)
                    worker.process.kill()

    def _close_incarnation(self) -> None:
        """What the incarnation's workers left behind (``setsid`` children), and its store."""
        for m in self.members:
            self.workers[m].process.kill()
        self._store = None

    def _start_incarnation(self) -> None:
        self.restart_count += 1
        self._store = dist.TCPStore(
            self.store_host,
            0,  # bind-0: the port is free, and held by this store while the group runs
            is_master=True,
            timeout=timedelta(seconds=max(30.0, self.spec.timeout)),
            wait_for_workers=False,
            use_libuv=True,
        )
        world = TorchrunWorld(
            run_id=self.spec.job_id,
            master_addr=self.store_host,
            master_port=int(self._store.port),
            restart_count=self.restart_count,
            max_restarts=self.spec.max_restarts,
            role=self.spec.role,
            gpus=self.spec.gpu,
        )
        inherited = {**os.environ, **self.spec.env}
        base = {**self.spec.env, "PYTHONUNBUFFERED": "1"}
        members = [
            self._spawn(slot, {**base, **variables})
            for slot, variables in torchrun_env(self.desired, world, inherited)
        ]
        reason = "start" if self.restart_count == 0 else "restart"
        self.generation = Generation(self.restart_count, tuple(members), reason=reason)
        self._started_at = time.monotonic()
        ranks = self._ranks(members)
        self._emit(
            "generation",
            f"generation {self.restart_count} ({reason}, TORCHELASTIC_RESTART_COUNT="
            f"{self.restart_count}): {len(members)} workers: {ranks}",
        )

    # -- processes ----------------------------------------------------------------------

    def _spawn(self, slot: str, env: dict[str, str]) -> str:
        # No readiness signal from a torchrun script: it is a member once started.
        worker = self._spawn_worker(slot, env, worker_id=self.ids.take(), phase=WorkerPhase.MEMBER)
        return worker.id

    def _kill_all(self) -> None:
        super()._kill_all()
        self._store = None

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM every worker, wait up to ``grace`` seconds, kill what is left; closes
        the logs."""
        live = [w for w in self.workers.values() if w.phase is not WorkerPhase.EXITED]
        for worker in live:
            worker.killed = True
            worker.process.terminate()
        wait_for_exit(live, grace)
        self._stopped()
