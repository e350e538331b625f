"""Listing jobs a page at a time: the cursor, the query, and rows that cannot be read.

Jobs are listed in submission order (``submitted_at``, then ``id``); a page ends with a
cursor naming its last job, and the next page starts just after it, so jobs submitted
meanwhile never shift a page. Or only the jobs changed after a change number (``since``),
in the order of their latest change: what a client that polls asks for. A row whose
stored data cannot be read becomes an :class:`UnreadableJob` in its place instead of
failing the whole page.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from tidal.controller.store.change_cache import ChangeCache
from tidal.controller.store.queries import LATEST_CHANGE, heads_query, rows
from tidal.controller.store.records import JobRecord
from tidal.controller.store.tables import JobRow
from tidal.model_states import JobState

__all__ = [
    "Cursor",
    "CursorError",
    "JobHead",
    "JobPage",
    "UnreadableJob",
    "UnreadableJobError",
    "job_heads",
    "read_page",
    "read_records",
]

log = logging.getLogger(__name__)


class CursorError(ValueError):
    """A page cursor that this server did not make."""


@dataclass(frozen=True)
class Cursor:
    """Where a page ended: the submission time and id of its last job."""

    submitted_at: float
    job_id: str

    def encode(self) -> str:
        """The cursor as the opaque, URL-safe text clients send back."""
        raw = json.dumps([self.submitted_at, self.job_id]).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """The cursor ``text`` encodes; :class:`CursorError` when it is not one."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            at, job_id = json.loads(raw)
        except (binascii.Error, ValueError, TypeError, RecursionError):
            raise CursorError("not a cursor from a previous page") from None
        if (
            not isinstance(at, int | float)
            or isinstance(at, bool)
            or not math.isfinite(at)
            or not isinstance(job_id, str)
        ):
            raise CursorError("not a cursor from a previous page")
        return cls(float(at), job_id)


class JobHead(NamedTuple):
    """A job's plain columns: enough to order, page and mark it, and to tell whether a
    cached record of it is current (``change``)."""

    id: str
    name: str
    submitted_at: float
    change: int


@dataclass(frozen=True)
class UnreadableJob:
    """A stored job whose row cannot be turned into a record (corrupt or foreign data)."""

    id: str
    name: str
    submitted_at: float
    error: str


class UnreadableJobError(LookupError):
    """The job exists but its stored row cannot be read (see :class:`UnreadableJob`)."""

    def __init__(self, job: UnreadableJob) -> None:
        super().__init__(f"job {job.id}: stored record cannot be read: {job.error}")
        self.job = job


@dataclass(frozen=True)
class JobPage:
    """One page of jobs and the cursor of the next page (``None`` on the last one)."""

    jobs: list[JobRecord | UnreadableJob]
    next: Cursor | None
    #: What to send as ``since`` to get only the jobs changed after this page was read.
    change: int = 0
    #: Each job's change number as the page read it (what a view of it can be kept by).
    changes: Mapping[str, int] = field(default_factory=dict)

    def readable(self) -> list[JobRecord]:
        """The page's jobs that could be read."""
        return [j for j in self.jobs if isinstance(j, JobRecord)]


def job_heads(
    session: Session,
    states: Sequence[JobState] | None = None,
    name: str | None = None,
    after: Cursor | None = None,
    since: int | None = None,
    limit: int | None = None,
    *,
    job_id: str | None = None,
    newest_first: bool = False,
) -> list[JobHead]:
    """The matching jobs' :class:`JobHead` columns, in submission order (or, with
    ``since``, the jobs changed after that change number, in the order of their latest
    change; with ``newest_first``, the latest submitted first), at most ``limit``: plain
    columns, readable even where a job's JSON columns are not."""
    query = heads_query(
        by_id=job_id is not None,
        by_name=name is not None,
        by_states=bool(states),
        after=after is not None,
        since=since is not None,
        limited=limit is not None,
        newest_first=newest_first,
    )
    params: dict[str, object] = {
        "id": job_id,
        "name": name,
        "states": [st.value for st in states or ()],
        "after_at": after.submitted_at if after is not None else None,
        "after_id": after.job_id if after is not None else None,
        "since": since,
        "limit": limit,
    }
    return [JobHead._make(row) for row in rows(session, query, params)]


def _read_one(
    session: Session, head: JobHead, cache: ChangeCache[JobRecord] | None
) -> JobRecord | UnreadableJob:
    try:
        row = session.scalars(select(JobRow).where(JobRow.id == head.id)).one()
        record = JobRecord.of_row(row)
    except Exception as exc:  # any decoding failure marks this row only
        log.warning("job %s cannot be read from the store: %s", head.id, exc)
        return UnreadableJob(head.id, head.name, head.submitted_at, f"{type(exc).__name__}: {exc}")
    if cache is not None:
        cache.put(record.id, row.change, record)
    return record


def read_records(
    session: Session, heads: Sequence[JobHead], cache: ChangeCache[JobRecord] | None = None
) -> list[JobRecord | UnreadableJob]:
    """The records of ``heads``, in their order: from ``cache`` where it holds a job at
    its head's change, the rest in one query, or row by row when one of them cannot be
    read (so only that one is marked)."""
    found: dict[str, JobRecord | UnreadableJob] = {}
    if cache is not None:
        for head in heads:
            record = cache.get(head.id, head.change)
            if record is not None:
                found[head.id] = record
    missing = [h for h in heads if h.id not in found]
    if missing:
        try:
            rows = session.scalars(select(JobRow).where(JobRow.id.in_([h.id for h in missing])))
            for row in rows:
                record = JobRecord.of_row(row)
                found[row.id] = record
                if cache is not None:
                    # The row's own number: under PostgreSQL's read committed it may be
                    # newer than the head's.
                    cache.put(record.id, row.change, record)
        except Exception:  # find the culprit below, row by row
            session.expunge_all()
            for head in missing:
                found[head.id] = _read_one(session, head, cache)
    return [found[h.id] for h in heads if h.id in found]


def read_page(
    session: Session,
    states: Sequence[JobState] | None,
    name: str | None,
    labels: Mapping[str, str],
    limit: int,
    after: Cursor | None,
    since: int | None = None,
    cache: ChangeCache[JobRecord] | None = None,
) -> JobPage:
    """Up to ``limit`` matching jobs after ``after`` (or changed after ``since``) and the
    cursors of the next page and of the next ``since``."""
    # Read before the page: a job that changes meanwhile is numbered higher, so the next
    # ``since`` lists it again rather than never.
    latest = int(rows(session, LATEST_CHANGE, {})[0][0] or 0)
    heads = job_heads(session, states, name, after, since, None if labels else limit + 1)
    found: list[JobRecord | UnreadableJob] = []
    if not labels:
        found = read_records(session, heads, cache)
    else:
        # Label filters run here, not in SQL (JSON querying differs between databases),
        # on chunks of candidates until the page is full.
        for start in range(0, len(heads), limit + 1):
            chunk = read_records(session, heads[start : start + limit + 1], cache)
            found += [
                j
                for j in chunk
                if isinstance(j, JobRecord) and all(j.labels.get(k) == v for k, v in labels.items())
            ]
            if len(found) > limit:
                break
    page, more = found[:limit], len(found) > limit
    read_at = {h.id: h.change for h in heads}
    changes = {j.id: read_at[j.id] for j in page}
    last = page[-1] if page else None
    if since is not None:
        if more and last is not None:
            # More changed jobs follow the last one: the next ask starts after its change
            # as this page read it (not as it may be now, which could skip some).
            latest = next(h.change for h in heads if h.id == last.id)
        return JobPage(page, None, latest, changes)
    cursor = Cursor(last.submitted_at, last.id) if more and last is not None else None
    return JobPage(page, cursor, latest, changes)
