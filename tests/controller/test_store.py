"""The store on a real SQLite file and a real PostgreSQL: round trips, filters, nothing lost
on a failed write, a private data dir. Migrations: test_migrations.py."""

from __future__ import annotations

import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.exc import StatementError

from tidal.controller.store.jobs import Event, JobStore
from tidal.launch.api import WorkerState, WorkerStatus
from tidal.model import JobState, JobStateError
from tidal.spec import JobSpec, parse_spec


@pytest.fixture
def store(db_url: str) -> Iterator[JobStore]:
    s = JobStore(db_url)
    yield s
    s.close()


def spec(name: str = "mnist", **extra: object) -> JobSpec:
    return parse_spec({"name": name, "command": "python train.py", "workers": "1:4", **extra})


def test_job_round_trip_survives_reopen(tmp_path: Path) -> None:
    s = JobStore.open(tmp_path)
    job = s.add_job(spec(labels={"team": "vision"}), now=10.0)
    s.update_job(job.id, now=11.0, slots=[("h", 1), ("h", 0)], state=JobState.RUNNING)
    s.close()
    again = JobStore.open(tmp_path)
    got = again.get_job(job.id)
    assert got is not None
    assert got.state is JobState.RUNNING
    assert got.slots == (("h", 0), ("h", 1))
    assert got.spec.workers.max == 4
    assert got.labels == {"team": "vision"}
    assert [a.count for a in again.allocations(job.id)] == [2]
    assert [e.kind for e in again.events(job.id)] == ["submitted"]
    again.close()


def test_sqlite_file_is_in_wal_mode(tmp_path: Path) -> None:
    store = JobStore.open(tmp_path)
    store.add_job(spec())
    store.close()
    with sqlite3.connect(tmp_path / "tidal.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_data_dir_and_database_are_private(tmp_path: Path) -> None:
    data_dir = tmp_path / "new" / "data"
    made = JobStore.open(data_dir)
    made.add_job(spec())
    files = sorted(p.name for p in data_dir.iterdir())
    assert files == ["tidal.db", "tidal.db-shm", "tidal.db-wal"]
    for name in files:
        assert stat.S_IMODE((data_dir / name).stat().st_mode) == 0o600, name
    made.close()
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    # A data dir and database made by an earlier release (umask 022) are tightened.
    data_dir.chmod(0o755)
    (data_dir / "tidal.db").chmod(0o644)
    JobStore.open(data_dir).close()
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((data_dir / "tidal.db").stat().st_mode) == 0o600


def test_list_filters(store: JobStore) -> None:
    a = store.add_job(spec("a", labels={"team": "x"}), now=1.0)
    b = store.add_job(spec("b", labels={"team": "y"}), now=2.0)
    store.update_job(b.id, state=JobState.RUNNING)
    assert [j.id for j in store.list_jobs()] == [a.id, b.id]
    assert [j.id for j in store.list_jobs(states=[JobState.RUNNING])] == [b.id]
    assert [j.id for j in store.list_jobs(name="a")] == [a.id]
    assert [j.id for j in store.list_jobs(labels={"team": "y"})] == [b.id]
    assert store.count_by_state()[JobState.QUEUED] == 1
    assert store.resolve("b") == store.get_job(b.id)
    assert store.resolve("nope") is None


def test_failed_write_changes_nothing(store: JobStore) -> None:
    job = store.add_job(spec(), now=1.0)
    before = store.get_job(job.id)
    # The event's data cannot be stored: the job change in the same call must not land.
    # (SQLAlchemy serialises JSON for SQLite; psycopg does it itself, and raises TypeError.)
    refused = TypeError if store.engine.dialect.name == "postgresql" else StatementError
    with pytest.raises(refused):
        store.update_job(
            job.id,
            slots=[("h", 0)],
            state=JobState.RUNNING,
            event=Event("started", data={"bad": object()}),
        )
    assert store.get_job(job.id) == before
    assert store.allocations(job.id) == []
    assert [e.kind for e in store.events(job.id)] == ["submitted"]


def test_state_precondition_is_checked_inside_the_transaction(store: JobStore) -> None:
    job = store.add_job(spec())
    store.update_job(job.id, state=JobState.CANCELLED)
    with pytest.raises(JobStateError):
        store.update_job(job.id, expect=[JobState.QUEUED], priority=1)
    assert store.get_job(job.id).priority == 5000  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="cannot update"):
        store.update_job(job.id, name="renamed")


def test_sync_workers_reports_each_failure_once(store: JobStore) -> None:
    job = store.add_job(spec())
    ok = WorkerStatus(0, ("h", 0), WorkerState.RUNNING, pid=10)
    bad = WorkerStatus(1, ("h", 1), WorkerState.FAILED, pid=11, exit_code=1)
    assert store.sync_workers(job.id, [ok, WorkerStatus(1, ("h", 1), WorkerState.RUNNING)]) == []
    assert store.sync_workers(job.id, [ok, bad]) == [bad]
    assert store.sync_workers(job.id, [ok, bad]) == []
    assert [w.state for w in store.workers(job.id)] == [WorkerState.RUNNING, WorkerState.FAILED]


def test_metrics_round_trip(store: JobStore) -> None:
    job = store.add_job(spec())
    store.add_metrics(job.id, 2, {"loss": 0.5})
    store.add_metrics(job.id, 1, {"loss": 0.9})
    assert [(m.step, m.values["loss"]) for m in store.metrics(job.id)] == [(1, 0.9), (2, 0.5)]
    with pytest.raises(KeyError):
        store.add_metrics("missing", 1, {"loss": 1.0})


def test_metrics_many_and_goodput(store: JobStore) -> None:
    job = store.add_job(spec())
    store.add_metrics_many(job.id, [(1, 10.0, {"loss": 0.9}), (2, 11.0, {"loss": 0.5})])
    assert [m.step for m in store.metrics(job.id)] == [1, 2]
    store.set_goodput(job.id, {"batch_size": 64}, now=5.0)
    store.set_goodput(job.id, {"batch_size": 128}, now=6.0)
    record = store.goodput([job.id])[job.id]
    assert (record.time, record.report["batch_size"]) == (6.0, 128)
    assert store.goodput(["other"]) == {}
