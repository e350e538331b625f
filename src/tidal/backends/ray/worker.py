"""A worker as a Ray actor: the user's command runs as a subprocess on the actor's node.

The actor (:class:`~tidal.backends.ray.actor.WorkerActor`) is only a handle on a node: it
starts the command with the runtime's ``TIDAL_*`` variables, buffers its output, and
reports the exit status. The controller side (:class:`RayProcess`) makes that look like a
local subprocess to the :class:`~tidal.launch.groups.elastic.WorkerGroup`, so the rescale
protocol is the very same code as for local workers. A dead actor (its node died, or
someone killed it) reads as a worker killed by SIGKILL: the group publishes a failure
generation and the survivors go on."""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tidal.backends.ray.actor import WorkerActor
from tidal.launch.limits import WorkerLimits
from tidal.launch.log_sink import MAX_LINE_CHARS
from tidal.launch.slot_names import slot_host, slot_indices

__all__ = ["EXIT_LOST", "RayProcess", "RaySpawner", "Unplaced"]

log = logging.getLogger("tidal.backends.ray")

#: Exit status reported for a worker whose actor died (node lost, actor killed): the same
#: a SIGKILLed local subprocess has.
EXIT_LOST = -int(signal.SIGKILL)
#: How often the controller asks an actor for news (exit status and new output). The
#: workers notice a dead peer by themselves at once; this only bounds how late the group
#: reaps an exit, and keeps the per-worker cost of polling small.
POLL_INTERVAL = 0.1


class RayProcess:
    """The controller's handle on one worker actor; a
    :class:`~tidal.launch.process.WorkerProcess`. Never blocks but in :meth:`kill` and
    :meth:`wait`."""

    def __init__(
        self,
        actor: Any,
        start: Any,
        on_line: Callable[[str], None],
        name: str,
        on_lost: Callable[[], None] | None = None,
        node_gone: Callable[[], bool] | None = None,
    ) -> None:
        """``on_lost`` is called when the actor is found dead; ``node_gone`` says whether
        its node has left the cluster."""
        self._actor = actor
        self._start = start  # ObjectRef of WorkerActor.start: the pid
        self._on_line = on_line
        self._name = name
        self._on_lost = on_lost
        self._node_gone = node_gone
        self._pid: int | None = None
        self._started = False
        #: The actor ran ``start``: the command ran (or was refused) on the node.
        self._ran = False
        #: Never ran, and its node is gone: waits like :class:`Unplaced`.
        self._unplaced = False
        self._code: int | None = None
        self._pending: Any = None  # ObjectRef of the poll in flight
        self._last_poll = 0.0
        self._partial = ""

    @property
    def pid(self) -> int | None:
        """The command's pid on its node, once the actor started it."""
        self._check_started()
        return self._pid

    @property
    def returncode(self) -> int | None:
        """The exit status once known."""
        return self._code

    @property
    def unplaced(self) -> bool:
        """Its node died before it ran: it waits, like :class:`Unplaced`, to be let go."""
        return self._unplaced and self._code is None

    def _check_started(self) -> None:
        if self._started:
            return
        ready, _ = ray.wait([self._start], timeout=0)
        if ready:
            self._started = True
            with contextlib.suppress(RayError):  # a dead actor: poll reports it
                self._pid = ray.get(self._start)
                self._ran = True

    def poll(self) -> int | None:
        """Collect the answer of the last status request, if in, and send the next one."""
        if self._code is not None or self._unplaced:
            return self._code
        if self._pending is None:
            if time.monotonic() - self._last_poll < POLL_INTERVAL:
                return None
            self._pending = self._actor.poll.remote()
        ready, _ = ray.wait([self._pending], timeout=0)
        if not ready:
            return None
        ref, self._pending = self._pending, None
        self._last_poll = time.monotonic()
        self._take(ref)
        return self._code

    def _take(self, ref: Any) -> None:
        """Deliver an answer of ``poll``/``kill``; a failed call means the actor is gone."""
        try:
            code, text = ray.get(ref)
        except RayError as exc:
            code, text = EXIT_LOST, ""
            if self._on_lost is not None:
                self._on_lost()  # perhaps its node died: look again before replacing it
            self._check_started()
            if not self._ran and self._node_gone is not None and self._node_gone():
                # Placed on a node that died before the worker ran (Ray can take seconds
                # to declare a node dead): nothing failed, and its slot no longer exists.
                log.info("worker %s: its node died before it started", self._name)
                self._unplaced = True
                return
            log.warning("worker %s lost: %s", self._name, _first_line(exc))
        self._deliver(text)
        if code is not None:
            self._finish(code)

    def _deliver(self, text: str) -> None:
        text = self._partial + text
        *lines, self._partial = text.split("\n")
        # Cut at the bound a local worker's pipe is cut at: a line without end is handed
        # on in pieces, not held (and joined again each poll) until it ends.
        for line in lines:
            for at in range(0, max(len(line), 1), MAX_LINE_CHARS):
                self._on_line(line[at : at + MAX_LINE_CHARS] + "\n")
        while len(self._partial) >= MAX_LINE_CHARS:
            self._on_line(self._partial[:MAX_LINE_CHARS] + "\n")
            self._partial = self._partial[MAX_LINE_CHARS:]

    def _finish(self, code: int) -> None:
        self._code = code
        if self._partial:
            self._on_line(self._partial + "\n")
            self._partial = ""
        self._check_started()
        # The actor holds the slot's resource on its node until it ends.
        with contextlib.suppress(Exception):
            ray.kill(self._actor, no_restart=True)

    def kill(self) -> None:
        """Kill the command's session through the actor; the actor itself if that fails
        (not started yet, or not answering)."""
        if self._code is not None:
            return
        self._check_started()
        if self._started and not self._unplaced:
            # The poll in flight first: its answer carries output the kill's does not.
            pending, self._pending = self._pending, None
            refs = [pending] if pending is not None else []
            for ref in [*refs, self._actor.kill.remote()]:
                ready, _ = ray.wait([ref], timeout=15)
                if not ready:
                    break
                self._take(ref)
                if self._code is not None:
                    return
        # Still being placed (or hung): killing the actor kills the command with it.
        with contextlib.suppress(Exception):
            ray.kill(self._actor, no_restart=True)
        self._finish(EXIT_LOST)

    def terminate(self) -> None:
        """Ask the actor to SIGTERM the command's session, without waiting for it (the
        exit shows in a later :meth:`poll`)."""
        self._check_started()
        if self._code is None and self._started and not self._unplaced:
            with contextlib.suppress(Exception):
                self._actor.terminate.remote()

    def wait(self, timeout: float) -> int | None:
        """Poll until the exit status is known, at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return self._code

    def drain(self, timeout: float) -> None:
        """Output arrives with the exit status: nothing is left once it is known."""
        self.wait(timeout)


class Unplaced:
    """A worker for a slot whose node is gone: it never starts, and it does not fail
    either (that would count against the job's restart budget for a slot that no longer
    exists). It waits, "starting", until the group lets it go, which it does once the
    controller moved the job off the node's slots."""

    pid: int | None = None

    def __init__(self) -> None:
        self._code: int | None = None

    @property
    def unplaced(self) -> bool:
        """Until let go."""
        return self._code is None

    @property
    def returncode(self) -> int | None:
        """``-9`` once let go."""
        return self._code

    def poll(self) -> int | None:
        """Never exits by itself."""
        return self._code

    def kill(self) -> None:
        """Let it go."""
        self._code = EXIT_LOST

    def terminate(self) -> None:
        """Let it go: nothing runs."""
        self.kill()

    def wait(self, timeout: float) -> int | None:
        """Nothing to wait for."""
        return self._code

    def drain(self, timeout: float) -> None:
        """No output."""


class RaySpawner:
    """Starts workers as :class:`~tidal.backends.ray.actor.WorkerActor` actors pinned to
    the node of their slot.

    ``placement`` maps a slot's host name to its Ray node id and the resource one worker
    takes there (``tidal_slot``, or ``GPU``), or to ``None`` for a node that is gone. The
    controller's slots decide what runs where; an actor also reserves its worker's
    ``resources.cpus`` and ``resources.memory`` (:func:`reservation`), so Ray places no
    other task on what the worker was promised.
    """

    def __init__(
        self,
        placement: Callable[[str], tuple[str, str] | None],
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        """``on_lost`` is called when a worker's actor died (before the group replaces
        it), so the node table can be looked at again."""
        self._placement = placement
        self._on_lost = on_lost

    def spawn(
        self,
        *,
        worker_id: str,
        slot: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | None,
        on_line: Callable[[str], None],
    ) -> RayProcess | Unplaced:
        """Create the actor on the slot's node and have it start the command."""
        host = slot_host(slot)
        where = self._placement(host)
        if where is None:
            log.info("worker %s: the node of slot %s is gone; not started", worker_id, slot)
            return Unplaced()
        node_id, resource = where
        options: dict[str, Any] = {
            **reservation(WorkerLimits.from_env(env)),
            "max_restarts": 0,
            "max_task_retries": 0,
            # Soft affinity would run the worker elsewhere; the controller chose the node.
            # If the node dies first, the actor fails, which reads as a lost worker.
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
        }
        # A worker of several GPUs is named ``host:2,3``: it takes that many of the node's.
        width = len(slot_indices(slot))
        if resource == "GPU":
            options["num_gpus"] = width  # Ray sets CUDA_VISIBLE_DEVICES to the GPUs it gives
        else:
            options["resources"] = {resource: width}
        actor = _remote_actor().options(**options).remote()
        start = actor.start.remote(list(argv), dict(env), cwd)
        log.info("worker %s: actor for slot %s on node %s", worker_id, slot, node_id)
        return RayProcess(
            actor,
            start,
            on_line,
            f"{worker_id}@{slot}",
            on_lost=self._on_lost,
            node_gone=lambda: self._placement(host) is None,
        )


def reservation(limits: WorkerLimits) -> dict[str, Any]:
    """The actor options that reserve a worker's CPUs and memory on its node."""
    options: dict[str, Any] = {"num_cpus": limits.cpus or 0}
    if limits.memory is not None:
        options["memory"] = limits.memory
    return options


_REMOTE: Any = None


def _remote_actor() -> Any:
    """The actor class, declared to Ray once per process."""
    global _REMOTE
    if _REMOTE is None:
        _REMOTE = ray.remote(WorkerActor)
    return _REMOTE


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
