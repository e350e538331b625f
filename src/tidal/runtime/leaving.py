"""How a worker that the runtime releases ends its process: promptly.

A released worker's slot is free only once its process is gone, and the receiving job's
new worker waits for that. Leaving the generation takes milliseconds; what took seconds
was interpreter shutdown after the exit handlers (tearing down the modules of torch, numpy
and the script's other imports: ~2 s on an idle core, 6-12 s on a loaded machine), which
does nothing the launcher needs. So once the runtime has left the process group, released
any broken group (``WorkerContext.close`` waits for that: a live broken gloo group at
shutdown crashes the process) and run the exit handlers, the process ends with
``os._exit(EXIT_RELEASED)``: no module teardown, no destructor can block or crash it.

Only this path ends a process so; a script that finishes or fails exits the usual way
with its own status.
"""

from __future__ import annotations

import atexit
import io
import logging
import os
import sys
from types import ModuleType
from typing import NoReturn

from tidal.runtime.env import EXIT_RELEASED

log = logging.getLogger("tidal.runtime")


def exit_released() -> NoReturn:
    """Run the exit handlers (the script's and the runtime's: metrics flushed, watcher
    stopped, process group released), flush every open file, end with ``EXIT_RELEASED``.

    ``try``/``finally`` blocks and ``with`` blocks of the script around the loop do not
    run (the worker ends inside ``state.step()``); ``atexit`` handlers do."""
    try:
        atexit._run_exitfuncs()
    finally:
        _flush_open_files()
        os._exit(EXIT_RELEASED)


def _flush_open_files() -> None:
    """Flush what interpreter shutdown would have: the standard streams and the files the
    script holds open for writing (buffered lines of a log would be lost else).

    The worker ends inside ``state.step()``, so the script's frames are on this thread's
    stack: its files are found in their locals and globals, or one attribute away
    (``self.log``). A scan of every object (``gc.get_objects``) would find more but costs
    ~0.5 s with torch loaded on a busy machine, what this exit is meant to save."""
    for stream in (sys.stdout, sys.stderr):
        _flush(stream)
    seen: set[int] = set()
    frame = sys._getframe()
    while frame is not None:
        for namespace in (frame.f_locals, frame.f_globals):
            if id(namespace) in seen:
                continue
            seen.add(id(namespace))
            for value in list(namespace.values()):
                _flush(value)
                attributes = getattr(value, "__dict__", None)
                if isinstance(attributes, dict) and not isinstance(value, type | ModuleType):
                    for attribute in list(attributes.values()):
                        _flush(attribute)
        frame = frame.f_back  # type: ignore[assignment]


def _flush(obj: object) -> None:
    if not isinstance(obj, io.TextIOWrapper | io.BufferedWriter | io.BufferedRandom):
        return
    try:
        if not obj.closed and obj.writable():
            obj.flush()
    except (OSError, ValueError) as exc:  # a closed pipe, a full disk
        log.debug("flush at release: %s", exc)
