"""``tidal run``'s arguments, checked before anything heavy loads.

A mistyped ``--workers`` is answered at once, without importing torch (which the
launcher, :mod:`tidal.launch.run`, needs to start workers).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from tidal.model import Launcher

__all__ = [
    "UsageProblem",
    "check_launcher",
    "parse_resize_plan",
    "parse_workers",
    "worker_argv",
]

#: The launchers ``--launcher`` may name.
_LAUNCHERS = tuple(launcher.value for launcher in Launcher)


class UsageProblem(ValueError):
    """Bad command-line input; the message names the argument."""


def parse_workers(text: str) -> tuple[int, int]:
    """``MIN:MAX`` (or ``N`` for a fixed size) into a pair; raises :class:`UsageProblem`."""
    parts = text.split(":")
    try:
        if len(parts) == 1:
            low = high = int(parts[0])
        elif len(parts) == 2:
            low, high = int(parts[0]), int(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise UsageProblem(f"--workers: expected MIN:MAX or N, got {text!r}") from None
    if low < 1 or high < 1:
        raise UsageProblem(f"--workers: sizes must be >= 1, got {text!r}")
    if low > high:
        raise UsageProblem(f"--workers: MIN must be <= MAX, got {low} > {high}")
    return low, high


def parse_resize_plan(text: str, low: int, high: int) -> list[tuple[int, int]]:
    """``STEP:N,STEP:N`` into ``[(step, workers)]`` sorted by step."""
    plan = []
    for item in filter(None, text.split(",")):
        try:
            step_text, n_text = item.split(":")
            step, n = int(step_text), int(n_text)
        except ValueError:
            raise UsageProblem(f"--resize-at: expected STEP:N[,STEP:N...], got {text!r}") from None
        if not low <= n <= high or step < 0:
            raise UsageProblem(
                f"--resize-at: {item!r} needs STEP >= 0 and N within --workers {low}:{high}"
            )
        plan.append((step, n))
    return sorted(plan)


def check_launcher(launcher: str, *, stop_grace: float, given: Mapping[str, bool]) -> None:
    """Refuse a launcher tidal does not have, and options of the ``tidal`` launcher given
    to ``torchrun`` (``given``: option → whether the user set it): a torchrun script keeps
    its own checkpoints and does not report its step."""
    if launcher not in _LAUNCHERS:
        raise UsageProblem(f"--launcher: expected one of {', '.join(_LAUNCHERS)}, got {launcher!r}")
    if stop_grace < 0:
        raise UsageProblem(f"--stop-grace: expected seconds >= 0, got {stop_grace}")
    if launcher == "torchrun":
        for option, was_given in given.items():
            if was_given:
                raise UsageProblem(
                    f"{option}: not with --launcher torchrun (the script keeps its own "
                    "checkpoints and step count; use the tidal launcher for this)"
                )


def worker_argv(command: list[str]) -> list[str]:
    """A ``.py`` script runs under this interpreter; anything else runs as given."""
    if not command:
        raise UsageProblem("SCRIPT: missing; give the training script (and its arguments)")
    script = command[0]
    if script.endswith(".py"):
        if not Path(script).is_file():
            raise UsageProblem(f"SCRIPT: no such file {script!r}")
        return [sys.executable, script, *command[1:]]
    return command
