"""The hosts being drained, as stored: a server restart keeps draining them."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sqlalchemy import select

from tidal.controller.store.database import Database
from tidal.controller.store.tables import EventRow, HostDrainRow

__all__ = ["DrainSource", "HostDrain", "HostDrains"]


class DrainSource(enum.Enum):
    """Who marked a host leaving."""

    #: An admin (``tidal drain``, the API, the dashboard).
    ADMIN = "admin"
    #: A cloud's preemption notice, through the notice hook.
    NOTICE = "notice"
    #: Ray's own drain notice for the node.
    RAY = "ray"


@dataclass(frozen=True)
class HostDrain:
    """A host marked leaving: since ``requested_at``, going at ``leaves_at`` if known."""

    host: str
    requested_at: float
    leaves_at: float | None
    source: DrainSource


class HostDrains(Database):
    """The store's draining hosts (a base of :class:`~tidal.controller.store.jobs.JobStore`)."""

    def drains(self) -> dict[str, HostDrain]:
        """Every host being drained, by name."""
        with self._transaction() as s:
            found = s.scalars(select(HostDrainRow).order_by(HostDrainRow.host)).all()
            return {row.host: _drain(row) for row in found}

    def mark_draining(
        self, host: str, now: float, *, leaves_at: float | None, source: DrainSource
    ) -> HostDrain:
        """Mark ``host`` leaving (again: an earlier deadline wins), with a ``drain`` event."""
        with self._transaction(write=True) as s:
            row = s.get(HostDrainRow, host)
            if row is None:
                row = HostDrainRow(
                    host=host, requested_at=now, leaves_at=leaves_at, source=source.value
                )
                s.add(row)
            elif leaves_at is not None and (row.leaves_at is None or leaves_at < row.leaves_at):
                # A second notice may only bring the deadline forward: the host goes at
                # the earliest time anyone was told.
                row.leaves_at = leaves_at
                row.source = source.value
            when = "" if row.leaves_at is None else f", leaving in {row.leaves_at - now:.0f}s"
            s.add(
                EventRow(
                    job_id=None,
                    time=now,
                    kind="drain",
                    message=f"host {host} drained by {source.value}{when}",
                    data={"host": host, "leaves_at": row.leaves_at, "source": source.value},
                )
            )
            s.flush()
            return _drain(row)

    def unmark_draining(self, host: str, now: float) -> bool:
        """Take ``host`` back into service; ``False`` when it was not draining."""
        with self._transaction(write=True) as s:
            row = s.get(HostDrainRow, host)
            if row is not None:
                s.delete(row)
                s.add(
                    EventRow(
                        job_id=None,
                        time=now,
                        kind="undrain",
                        message=f"host {host} back in service",
                        data={"host": host},
                    )
                )
            return row is not None


def _drain(row: HostDrainRow) -> HostDrain:
    return HostDrain(row.host, row.requested_at, row.leaves_at, DrainSource(row.source))
