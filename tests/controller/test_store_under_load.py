"""What keeps the store fast under many requests, and still right: jobs submitted at once
committed together, records reused until their row changes, reads sharing one
transaction. On a real SQLite file and a real PostgreSQL (``db_url``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence

import pytest
from sqlalchemy import select

from tidal.controller.store.group_commit import GroupCommit
from tidal.controller.store.jobs import JobStore
from tidal.controller.store.tables import JobRow
from tidal.model import JobState
from tidal.spec import JobSpec, parse_spec

WAIT = 30.0


@pytest.fixture
def store(db_url: str) -> Iterator[JobStore]:
    s = JobStore(db_url)
    yield s
    s.close()


def spec(name: str) -> JobSpec:
    return parse_spec({"name": name, "command": "python train.py", "workers": "1:4"})


def _until(condition: object, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _queued_behind_a_leader(
    commit: Callable[[Sequence[str]], list[str]], lead: str, items: Sequence[str]
) -> dict[str, object]:
    """``add(lead)``, and while its commit is held, ``add`` of each of ``items`` from a
    thread of its own; what each caller got (its result, or the exception it raised)."""
    first_in, release = threading.Event(), threading.Event()
    calls = 0

    def held(batch: Sequence[str]) -> list[str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            first_in.set()
            assert release.wait(WAIT)
        return commit(batch)

    group: GroupCommit[str, str] = GroupCommit(held)
    outcomes: dict[str, object] = {}

    def add(item: str) -> None:
        try:
            outcomes[item] = group.add(item)
        except ValueError as exc:
            outcomes[item] = exc

    threads = [threading.Thread(target=add, args=(lead,))]
    threads[0].start()
    assert first_in.wait(WAIT)
    for item in items:
        threads.append(threading.Thread(target=add, args=(item,)))
        threads[-1].start()
    _until(lambda: len(group._queued) == len(items), f"{len(items)} additions queued")
    release.set()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()
    return outcomes


def test_additions_queued_while_one_commits_are_committed_together() -> None:
    commits: list[list[str]] = []

    def commit(items: Sequence[str]) -> list[str]:
        commits.append(list(items))
        return [f"stored {i}" for i in items]

    outcomes = _queued_behind_a_leader(commit, "a", ["b", "c", "d"])
    assert commits[0] == ["a"]
    assert sorted(commits[1]) == ["b", "c", "d"]
    assert len(commits) == 2
    assert outcomes == {i: f"stored {i}" for i in "abcd"}


def test_a_bad_addition_fails_only_its_own_caller() -> None:
    batches: list[list[str]] = []

    def commit(items: Sequence[str]) -> list[str]:
        batches.append(list(items))
        if "bad" in items:
            raise ValueError("bad item")
        return [i.upper() for i in items]

    outcomes = _queued_behind_a_leader(commit, "lead", ["ok1", "bad", "ok2"])
    assert batches[0] == ["lead"]
    assert sorted(batches[1]) == ["bad", "ok1", "ok2"]  # together, refused as a whole
    assert sorted(batches[2:]) == [["bad"], ["ok1"], ["ok2"]]  # then each alone
    assert outcomes["lead"] == "LEAD"
    assert (outcomes["ok1"], outcomes["ok2"]) == ("OK1", "OK2")
    assert isinstance(outcomes["bad"], ValueError)


def test_jobs_submitted_at_once_are_all_stored_with_distinct_change_numbers(
    store: JobStore,
) -> None:
    start = threading.Barrier(6)
    added: list[str] = []
    lock = threading.Lock()

    def submit(t: int) -> None:
        start.wait(WAIT)
        for k in range(10):
            job = store.add_job(spec(f"t{t}-{k}"))
            with lock:
                added.append(job.id)

    threads = [threading.Thread(target=submit, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()
    assert len(set(added)) == 60
    jobs = store.list_jobs()
    assert sorted(j.id for j in jobs) == sorted(added)
    assert all(j.state is JobState.QUEUED for j in jobs)
    assert sorted(str(e.job_id) for e in store.events() if e.kind == "submitted") == sorted(added)
    with store._transaction() as s:
        changes = list(s.scalars(select(JobRow.change)))
    assert sorted(changes) == list(range(1, 61))
    # A page asked with ``since`` lists them all again in change order.
    page = store.job_page(since=0, limit=100)
    assert sorted(j.id for j in page.readable()) == sorted(added)
    assert page.change == 60


def test_a_record_is_reused_until_its_row_changes_even_from_another_store(
    store: JobStore, db_url: str
) -> None:
    job = store.add_job(spec("cached"))
    first = store.get_job(job.id)
    assert first is not None
    assert store.get_job(job.id) is first  # unchanged: the same record
    store.update_job(job.id, priority=9000)
    again = store.get_job(job.id)
    assert again is not first and again is not None and again.priority == 9000
    # Another process's write moves the change number too.
    other = JobStore(db_url)
    try:
        other.update_job(job.id, priority=100)
    finally:
        other.close()
    latest = store.get_job(job.id)
    assert latest is not None and latest.priority == 100
    assert [j.priority for j in store.list_jobs()] == [100]


def test_reads_in_a_snapshot_share_one_transaction_and_a_write_there_is_refused(
    store: JobStore,
) -> None:
    job = store.add_job(spec("snap"))
    with store.snapshot():
        assert store.get_job(job.id) is not None
        assert store.pending_requests([job.id]) == {}
        with pytest.raises(RuntimeError, match="inside a snapshot"):
            store.update_job(job.id, priority=1)
        assert [e.kind for e in store.events(job.id)] == ["submitted"]
    stored = store.get_job(job.id)
    assert stored is not None and stored.priority != 1
    store.update_job(job.id, priority=1)  # outside it, writes go on
    assert store.get_job(job.id).priority == 1  # type: ignore[union-attr]


def test_a_snapshot_is_one_view_while_others_write(store: JobStore) -> None:
    job = store.add_job(spec("view"))
    with store.snapshot():
        assert store.get_job(job.id).priority == job.priority  # type: ignore[union-attr]
        writer = threading.Thread(target=store.update_job, args=(job.id,), kwargs={"priority": 7})
        writer.start()
        writer.join(WAIT)
        assert not writer.is_alive()
        # Committed meanwhile, but not part of this view.
        assert store.get_job(job.id).priority == job.priority  # type: ignore[union-attr]
        assert [j.priority for j in store.list_jobs()] == [job.priority]
    assert store.get_job(job.id).priority == 7  # type: ignore[union-attr]


def test_the_record_a_submission_returns_is_the_stored_one(store: JobStore) -> None:
    # New jobs are inserted with one statement naming every column; a column added to the
    # table but not to that statement would leave the returned record different from the
    # stored row (its default only in the database).
    added = store.add_job(spec("returned"))
    other = JobStore(store.url)  # another store: nothing kept in memory
    try:
        assert other.get_job(added.id) == added
    finally:
        other.close()
