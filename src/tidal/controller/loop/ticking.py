"""When the controller loop ticks: a background thread that ticks every interval, at once
when a user asks for something, soon while a slot is being handed over, and with backoff
while ticks fail.

What a tick does is :class:`~tidal.controller.loop.controller.Controller`'s; this module
only paces the ticks and tells the log what their failures are (the policy of retrying is
:mod:`~tidal.controller.loop.backoff`'s).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from tidal.controller.loop.backoff import Failing, Report, after_tick
from tidal.controller.prometheus import ControllerMetrics
from tidal.controller.store.jobs import JobStore
from tidal.controller.store.outage import outage_of

__all__ = ["HANDOVER_INTERVAL", "HANDOVER_WINDOW", "MAX_WAKE_GAP", "MIN_WAKE_GAP", "TickThread"]

#: The loop's own logger: what it says of its ticks is told under the name operators
#: filter the loop's records by.
log = logging.getLogger("tidal.controller.loop.controller")

#: How soon the loop looks again while a job waits for a slot another job's worker is
#: leaving: the released worker exits within a step, and the slot should move right then,
#: not a whole interval later.
HANDOVER_INTERVAL = 0.05
#: For at most this long after a wait began (a worker stuck in a long step must not keep
#: the loop busy); the interval takes over after it.
HANDOVER_WINDOW = 10.0
#: The least time between the end of a tick and a tick a request wakes. Under a stream of
#: requests this is what bounds the loop's share of the process (a tick over 1,000 queued
#: jobs takes ~10 ms: a sixth of the time at 50 ms; at 20 ms, a third); a request that
#: comes alone still wakes a tick at once.
MIN_WAKE_GAP = 0.05
#: The most that gap grows to after a long tick: a request then waits for the tick under
#: way and this long, not twice the tick's length (a tick that cancels many jobs under
#: load takes seconds; requests kept arriving, so ticks grew and gaps with them).
MAX_WAKE_GAP = 0.25


class TickThread:
    """Calls ``tick`` in a background thread, paced: every interval, woken by
    :meth:`wake`, quicker during a handover, backing off while ticks fail."""

    def __init__(
        self, tick: Callable[[], None], store: JobStore, metrics: ControllerMetrics
    ) -> None:
        """``store``: named in the log when a tick fails of an outage of it; ``metrics``:
        counts failed ticks."""
        self._tick = tick
        self.store = store
        self.metrics = metrics
        self._stop = threading.Event()
        self._wake = threading.Event()
        #: Since when (monotonic) ticks have left a job waiting for a slot being released.
        self._handover_since: float | None = None
        self._thread: threading.Thread | None = None

    def start(self, interval: float) -> None:
        """Tick every ``interval`` seconds in a background thread until :meth:`stop`."""
        if self._thread is not None:
            raise RuntimeError("controller already started")
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(interval,), name="tidal-controller", daemon=True
        )
        self._thread.start()

    def wake(self) -> None:
        """Tick now rather than at the end of the interval (a user asked for something)."""
        self._wake.set()

    def stop(self, timeout: float) -> None:
        """Stop ticking, waiting up to ``timeout`` seconds for the tick under way."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("controller thread did not stop within %.1fs", timeout)
            self._thread = None

    def note_handover(self, waiting: bool) -> None:
        """Whether the last tick left a job waiting for a slot another job's worker is
        releasing: while it does (up to :data:`HANDOVER_WINDOW`), ticks come every
        :data:`HANDOVER_INTERVAL`."""
        if not waiting:
            self._handover_since = None
        elif self._handover_since is None:
            self._handover_since = time.monotonic()

    def _run(self, interval: float) -> None:
        failing: Failing | None = None
        while not self._stop.is_set():
            # Cleared before the tick: a request recorded during it wakes the next one.
            self._wake.clear()
            began = time.monotonic()
            error: Exception | None = None
            try:
                self._tick()
            except Exception as exc:
                # A failed tick (a full disk, the database down, a bug) must not end
                # scheduling for everyone: the loop backs off and tries again.
                error = exc
                self.metrics.tick_failures.inc()
            outcome = after_tick(failing, self._cause(error), began, interval)
            self._report(outcome.report, error, failing, began)
            failing = outcome.failing
            took = time.monotonic() - began
            if outcome.wait is not None:
                # A request recorded meanwhile (the store took a write) tries again at once.
                self._wake.wait(outcome.wait)
                continue
            if self._wake.wait(self._next_wait(interval)):
                # Woken by a request: requests arriving faster than ticks take are applied
                # together, so the loop spends at most a third of its time ticking and the
                # API (same process) keeps the rest; it waits two ticks' length at least,
                # up to MAX_WAKE_GAP.
                gap = min(max(MIN_WAKE_GAP, 2 * took), MAX_WAKE_GAP)
                self._stop.wait(gap - (time.monotonic() - began - took))

    def _cause(self, error: Exception | None) -> str | None:
        """What a tick failed of, for telling one failure from another: the outage's kind
        and place (its wording varies: a database refusing, then gone), else the error's
        type."""
        if error is None:
            return None
        outage = outage_of(error)
        if outage is not None:
            return f"{outage.kind.value}: {outage.path or self.store.location}"
        return type(error).__name__

    def _report(
        self,
        report: Report,
        error: Exception | None,
        before: Failing | None,
        now: float,
    ) -> None:
        """Log what :func:`~tidal.controller.loop.backoff.after_tick` says is news: a
        traceback only for an error that is not an outage (a bug), once."""
        if report is Report.RECOVERED and before is not None:
            log.warning(
                "controller ticks succeed again after %d failed over %.1fs",
                before.count,
                now - before.since,
            )
        elif report in (Report.STARTED, Report.CHANGED) and error is not None:
            outage = outage_of(error)
            cause = (
                outage.describe(self.store.location)
                if outage is not None
                else f"{type(error).__name__}: {error}"
            )
            log.warning(
                "controller ticks fail (%s); retrying with backoff, requests are applied "
                "once a tick succeeds",
                cause,
                exc_info=error if outage is None else None,
            )

    def _next_wait(self, interval: float) -> float:
        since = self._handover_since
        if since is not None and time.monotonic() - since < HANDOVER_WINDOW:
            return min(interval, HANDOVER_INTERVAL)
        return interval
