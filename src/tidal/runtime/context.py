"""The worker's view of its job: which generation it is in, its process group (formed and
left by :mod:`tidal.runtime.generation_groups`), and a watcher thread that turns a peer's
death into a prompt, clean error.

Why the guard: a gloo collective blocked on a dead peer only fails for the ranks wired to
that peer; the others wait for the full timeout. Every collective the runtime issues goes
through :meth:`WorkerContext.guard`, which returns a future that the watcher completes as
soon as the store says the generation is broken (a member reported a fault, or the launcher
published a failure generation). Nobody waits on a dead peer for longer than one poll.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from tidal.runtime.control import ControlChannel
from tidal.runtime.env import RuntimeConfig
from tidal.runtime.generation_groups import default_backend, form_groups, leave_groups
from tidal.runtime.group_release import drop_later, wait_for_releases
from tidal.runtime.rendezvous import (
    Generation,
    RendezvousClient,
    RendezvousTimeout,
    WorkerStore,
)
from tidal.runtime.sample_span import SampleSpan

log = logging.getLogger("tidal.runtime")

T = TypeVar("T")

_WATCH_INTERVAL = 0.02
_PROGRESS_INTERVAL = 0.2


class PeerLost(RuntimeError):
    """A collective of the current generation failed: a peer died or stopped answering."""


class WorkerContext:
    """Membership and process group of this worker. Create it with :func:`tidal.init`."""

    def __init__(self, config: RuntimeConfig | None = None) -> None:
        self.config = config or RuntimeConfig.from_env()
        self._store = WorkerStore.from_env(os.environ)
        self.worker_id = self._store.worker_id
        store = self._store.connect(timeout=max(30.0, self.config.timeout))
        self.rendezvous = RendezvousClient(store, self.worker_id)
        self.backend = self.config.backend or default_backend()
        self.device = torch.device("cuda", 0) if self.backend == "nccl" else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)

        self.generation: Generation | None = None
        self.rank = 0
        self.world_size = 1
        self.group: dist.ProcessGroup | None = None
        #: The generation's control channel (a CPU gloo group beside :attr:`group`): the
        #: membership agreement and the failure check run there, never on the GPU stream.
        self.control: ControlChannel | None = None
        #: The job's :class:`~tidal.runtime.parallel.ElasticDataParallel`, once built: the
        #: loader tells it each step's batch share (typed loosely: parallel imports us).
        self.parallel: Any = None
        #: Where the samples of the batch being computed sit in the job's data (set by
        #: the loader; per-sample dropout draws from it).
        self.sample_span: SampleSpan | None = None
        #: Progress, kept current by :class:`tidal.State` for the watcher's reports.
        self.step = 0
        self.epoch = 0
        #: Set when a collective of the current generation failed; cleared on re-join.
        self.failed = False
        self.failure: str | None = None

        self._lock = threading.Lock()
        self._pending: dict[torch.futures.Future[Any], Callable[[], Any]] = {}
        self._broken_gen: int | None = None
        self._fault_to_report: int | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._latest_seen = -1
        self._watcher: threading.Thread | None = None

    # -- membership ---------------------------------------------------------------------

    @property
    def is_member(self) -> bool:
        """Whether this worker is part of a formed generation."""
        return self.generation is not None and self.group is not None

    @property
    def latest_seen(self) -> int:
        """The newest generation number the watcher has seen in the store."""
        return self._latest_seen

    def join(self, after: int, *, newcomer: bool) -> Generation:
        """Wait for a generation newer than ``after``, meet its other members and form its
        process group. A newcomer skips generations that do not list it (it is admitted
        later); a current member gets the next generation whatever it says, and if that
        does not list it the caller leaves. Nothing is formed when not a member."""
        if newcomer:
            # Generations published before this worker said it was ready are not addressed
            # to it (the one that admits it comes after). Above all an empty one — every
            # worker released, the job waiting for slots — must not send away the workers
            # started to resume it.
            after = max(after, self.rendezvous.latest_number())
        local = self._store.local
        if local is not None and local.latest_number() < 0:
            local.publish(Generation(0, (self.worker_id,), reason="start"))
        if newcomer:
            self.rendezvous.mark_ready()
        while True:
            generation = self.rendezvous.wait_for_generation(
                after,
                skip_foreign=newcomer,
                timeout=None if newcomer else 10 * self.config.timeout + 60.0,
            )
            self._latest_seen = max(self._latest_seen, generation.number)
            if self.worker_id not in generation.members:
                return generation
            try:
                if not self.rendezvous.barrier(generation, timeout=self.config.timeout * 3):
                    after = generation.number
                    continue
                self._form(generation)
                return generation
            except (RendezvousTimeout, RuntimeError) as exc:
                log.warning(
                    "join gen=%d worker=%s failed: %s", generation.number, self.worker_id, exc
                )
                self.teardown()
                self.rendezvous.report_fault(generation.number)
                after = generation.number

    def _form(self, generation: Generation) -> None:
        rank = generation.rank_of(self.worker_id)
        assert rank is not None
        started = time.perf_counter()
        control = form_groups(
            self.backend,
            self.rendezvous.store,
            generation.number,
            rank,
            len(generation.members),
            self.config.timeout,
        )
        with self._lock:
            self.generation = generation
            self.rank = rank
            self.world_size = len(generation.members)
            self.group = dist.group.WORLD
            self.control = control
            self.failed = False
            self.failure = None
            self._broken_gen = None
        self._ensure_watcher()
        log.info(
            "formed gen=%d rank=%d world=%d worker=%s in %.1f ms",
            generation.number,
            rank,
            self.world_size,
            self.worker_id,
            (time.perf_counter() - started) * 1e3,
        )

    def teardown(self) -> None:
        """Leave the current process group (if any). Safe to call twice."""
        with self._lock:
            group, self.group = self.group, None
            control, self.control = self.control, None
        leave_groups(
            self.backend,
            control,
            formed=group is not None,
            failed=self.failed,
            timeout=self.config.timeout,
        )

    def release_after_failure(self, *objects: object) -> None:
        """Hand over objects that hold the broken generation's process group (a DDP
        wrapper): they are dropped off the training thread once its collectives have
        timed out (see :func:`drop_later`)."""
        drop_later(*objects, after=self.config.timeout + 1.0)

    def mark_formed(self) -> None:
        """Tell the launcher that this worker trains in the current generation."""
        assert self.generation is not None
        self.rendezvous.mark_formed(self.generation.number)

    # -- failure guard ------------------------------------------------------------------

    def guard(
        self,
        future: torch.futures.Future[Any],
        fallback: Callable[[], T],
        *,
        device: torch.device | None = None,
        pick: Callable[[Any], T] | None = None,
    ) -> torch.futures.Future[T]:
        """A future that completes with ``future``'s value, or with ``fallback()`` as soon
        as the current generation is known to be broken (then :attr:`failed` is set).

        ``device``: the GPU whose tensors the value holds. The future returned is then
        CUDA-aware, as NCCL's are: whoever waits on it has their stream wait for the
        collective's kernels. Without it, ``wait()`` would hand out a tensor the collective
        is still writing (the gradient bucket DDP reads right after its comm hook).
        ``pick``: what of ``future``'s value to complete with (default: all of it)."""
        devices: list[int | str | torch.device] | None = (
            [device] if device is not None and device.type == "cuda" else None
        )
        out: torch.futures.Future[T] = torch.futures.Future(devices=devices)
        with self._lock:
            broken = self._broken_gen is not None
            if not broken:
                self._pending[out] = fallback
        if broken:
            out.set_result(fallback())
            return out

        def finish(done: torch.futures.Future[Any]) -> None:
            with self._lock:
                mine = self._pending.pop(out, None) is not None
            if not mine:
                return
            try:
                value = done.value() if pick is None else pick(done.value())
            except Exception as exc:
                self._break(f"collective failed: {exc}", report=True)
                out.set_result(fallback())
                return
            out.set_result(value)

        future.add_done_callback(finish)
        return out

    def wait(self, future: torch.futures.Future[T]) -> T:
        """Wait for a collective's future; raises :class:`PeerLost` if the generation broke."""
        guarded: torch.futures.Future[T | None] = self.guard(future, lambda: None)
        value = self.wait_guarded(guarded)
        assert value is not None
        return value

    def wait_guarded(self, guarded: torch.futures.Future[T | None] | None) -> T | None:
        """Wait for a future :meth:`guard` returned with a ``None`` fallback (``None``:
        nothing in flight); raises :class:`PeerLost` if the generation broke."""
        value = guarded.wait() if guarded is not None else None
        if self.failed or (guarded is not None and value is None):
            raise PeerLost(self.failure or "peer lost")
        return value

    def collective_failed(self, exc: BaseException) -> None:
        """A collective outside :meth:`guard` failed (``exc``): the generation is broken,
        as if a guarded one had failed (the peers are told, the step is dropped)."""
        self._break(f"collective failed: {exc}", report=True)

    def _break(self, reason: str, *, report: bool) -> None:
        """Fail every pending collective of the current generation at once."""
        with self._lock:
            generation = self.generation
            if generation is None:
                return
            first = self._broken_gen is None
            self._broken_gen = generation.number
            self.failed = True
            if self.failure is None:
                self.failure = reason
            if report:
                self._fault_to_report = generation.number
            pending, self._pending = self._pending, {}
        if first:
            log.warning(
                "gen=%d broken at rank=%d worker=%s: %s",
                generation.number,
                self.rank,
                self.worker_id,
                reason,
            )
        for future, fallback in pending.items():
            if not future.done():
                future.set_result(fallback())
        self._wake.set()

    # -- watcher ------------------------------------------------------------------------

    def _ensure_watcher(self) -> None:
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="tidal-watcher", daemon=True)
            self._watcher.start()

    def _watch(self) -> None:
        # Its own connection: a TCPStore client is not meant to be shared across threads.
        store = self._store.connect(timeout=max(30.0, self.config.timeout))
        view = RendezvousClient(store, self.worker_id)
        last_progress = 0.0
        reported_step = -1
        while not self._stop.is_set():
            self._wake.wait(_WATCH_INTERVAL)
            self._wake.clear()
            try:
                with self._lock:
                    fault, self._fault_to_report = self._fault_to_report, None
                if fault is not None:
                    view.report_fault(fault)
                latest = view.latest_number()
                self._latest_seen = latest
                generation = self.generation
                if generation is None or self._broken_gen == generation.number:
                    continue
                if view.fault_count(generation.number) > 0:
                    self._break("a peer reported a failed collective", report=False)
                elif latest > generation.number:
                    newest = view.generation(latest)
                    if newest.reason in ("failure", "restart"):
                        self._break(f"workers lost: {', '.join(newest.lost)}", report=False)
                now = time.monotonic()
                if (
                    self.rank == 0
                    and self.step != reported_step
                    and now - last_progress > _PROGRESS_INTERVAL
                ):
                    view.report_progress(self.step, self.epoch, generation.number, self.world_size)
                    reported_step, last_progress = self.step, now
            except Exception as exc:  # the store may vanish when the launcher stops
                log.debug("watcher: %s", exc)
                time.sleep(_WATCH_INTERVAL)

    def close(self) -> None:
        """Let pending collectives finish (bounded), stop the watcher, leave the group."""
        deadline = time.monotonic() + min(self.config.timeout, 5.0)
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pending:
                    break
            time.sleep(0.005)
        self._stop.set()
        self._wake.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            # A daemon thread still inside a store call at interpreter exit aborts the
            # process (SIGABRT), which would read as a failure instead of a release.
            self._watcher.join(timeout=2 * _WATCH_INTERVAL + 1.0)
        self.teardown()
        wait_for_releases()


_context: WorkerContext | None = None


def init(config: RuntimeConfig | None = None) -> WorkerContext:
    """Join this process's job (launched by ``tidal run`` or a tidal server), or start a
    job of one worker when there is no launcher. Returns the same context when called
    again."""
    global _context
    if _context is None:
        _context = WorkerContext(config)
        # Stop the watcher before interpreter shutdown: a daemon thread caught inside a
        # store call at exit aborts the process, and a finished worker would look failed.
        atexit.register(_context.close)
    return _context


def current() -> WorkerContext:
    """The context of this process, created on first use."""
    return init()
