"""How the controller loop waits after failed ticks, and what it says about them.

A tick fails when the store cannot be written (a full disk, a database down) or on a bug.
Either may last: the loop then waits longer after each failure (doubling from its interval
up to :data:`MAX_BACKOFF_S`) and says so once when ticks start failing, again only if the
cause changes, and once when a tick succeeds again, instead of a traceback a tick. It never
gives up: requests recorded in the meantime are carried out by the first tick that works.

:func:`after_tick` decides; the loop only carries out what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["MAX_BACKOFF_S", "Failing", "Report", "TickOutcome", "after_tick"]

#: The longest wait between two failed ticks (seconds).
MAX_BACKOFF_S = 5.0


@dataclass(frozen=True)
class Failing:
    """Ticks are failing: how many in a row, since when, and why (the last cause said)."""

    count: int
    since: float
    cause: str


class Report(Enum):
    """What the loop logs after a tick."""

    NOTHING = "nothing"
    #: Ticks began failing (the first failure after a success).
    STARTED = "started"
    #: Still failing, for another cause than the one reported.
    CHANGED = "changed"
    #: A tick succeeded after failures.
    RECOVERED = "recovered"


@dataclass(frozen=True)
class TickOutcome:
    """The loop's state after a tick, how long to wait before the next one (``None``: the
    usual interval), and what to log."""

    failing: Failing | None
    wait: float | None
    report: Report


def after_tick(
    failing: Failing | None, cause: str | None, now: float, interval: float
) -> TickOutcome:
    """After a tick that failed for ``cause`` (``None``: it succeeded), given ``failing``
    (the failures before it, ``None`` if the last tick succeeded) and the loop's
    ``interval``: the wait is the interval after the first failure, then doubles, capped at
    :data:`MAX_BACKOFF_S` (or the interval, if that is longer)."""
    if cause is None:
        report = Report.NOTHING if failing is None else Report.RECOVERED
        return TickOutcome(None, None, report)
    if failing is None:
        return TickOutcome(Failing(1, now, cause), interval, Report.STARTED)
    count = failing.count + 1
    wait = min(max(interval, MAX_BACKOFF_S), interval * 2.0 ** min(count - 1, 32))
    report = Report.NOTHING if cause == failing.cause else Report.CHANGED
    return TickOutcome(Failing(count, failing.since, cause), wait, report)
