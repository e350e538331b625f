"""How a parameter-server worker ends when it is told to: SIGTERM (a shrink, a stop)
unwinds its script so the model leaves the job cleanly.

Without it the default action ends the process at once and the servers only notice the
silence after ``peer_timeout`` (a sync step waits that long for it, and the chief sees it
``lost``, not ``finished``). A SIGTERM that arrives in the middle of an exchange with the
servers is held until the exchange is over: unwinding inside it could cut a multipart
message in two, which the next send (the leave) would complete with its own frames.
"""

from __future__ import annotations

import atexit
import functools
import signal
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

__all__ = ["close_at_exit", "exchange", "leave_on_sigterm"]

_R = TypeVar("_R")


class _Closeable(Protocol):
    def close(self) -> None: ...


class _Termination:
    """SIGTERM's state in this process: how many exchanges with the servers are in
    flight, and a signal that arrived meanwhile."""

    busy = 0
    pending: int | None = None


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    if _Termination.busy:
        _Termination.pending = signum  # exits once the exchange in flight is over
        return
    raise SystemExit(128 + signum)


def leave_on_sigterm() -> None:
    """Make SIGTERM raise ``SystemExit`` (status 128 + 15), so ``with model:`` and
    :func:`close_at_exit` close the model. A handler the script installed itself is left
    alone, as is a model built off the main thread (Python handles signals there only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def exchange(method: Callable[..., _R]) -> Callable[..., _R]:
    """Run ``method`` (an exchange with the servers) whole: a SIGTERM that arrives
    during it ends the process right after it."""

    @functools.wraps(method)
    def run(*args: Any, **kwargs: Any) -> _R:
        _Termination.busy += 1
        try:
            result = method(*args, **kwargs)
        finally:
            _Termination.busy -= 1
        signum = _Termination.pending
        if signum is not None and not _Termination.busy:
            _Termination.pending = None
            raise SystemExit(128 + signum)
        return result

    return run


def close_at_exit(model: _Closeable) -> None:
    """Close ``model`` when the interpreter exits (also after SIGTERM's ``SystemExit``),
    without keeping it alive until then; closing twice is a no-op."""
    atexit.register(_close_if_alive, weakref.ref(model))


def _close_if_alive(model: weakref.ref[_Closeable]) -> None:
    alive = model()
    if alive is not None:
        alive.close()
