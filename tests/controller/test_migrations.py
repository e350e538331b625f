"""JobStore migrations: a new store is built by the migrations and equals the ORM models; a
store written by an earlier release upgrades in place with nothing lost; a store from a
newer release is refused untouched. On SQLite and on a real PostgreSQL."""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Engine, MetaData, String, create_engine, inspect, select, text

from tests.controller.postgres import Postgres
from tidal.controller.store import migrations
from tidal.controller.store.database import SCHEMA_VERSION
from tidal.controller.store.drains import DrainSource, HostDrain
from tidal.controller.store.jobs import JobRecord, JobStore
from tidal.controller.store.registry import ModelRun, RegistryConflict
from tidal.controller.store.requests import SetPriority
from tidal.launch.api import WorkerState, WorkerStatus
from tidal.model import JobState
from tidal.spec import parse_spec
from tidal.wire.registry import DatasetIn, ModelIn

FIXTURES = Path(__file__).parent / "fixtures"
RELEASES = {1: FIXTURES / "release_v1.db", 2: FIXTURES / "release_v2.db"}


def dump(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table, in primary-key order (alembic's own table left out)."""
    meta = MetaData()
    meta.reflect(engine)
    rows: dict[str, list[dict[str, Any]]] = {}
    with engine.connect() as conn:
        for name, table in meta.tables.items():
            if name == "alembic_version":
                continue
            key = list(table.primary_key.columns)
            rows[name] = [dict(r._mapping) for r in conn.execute(select(table).order_by(*key))]
    return rows


def schema_differences(engine: Engine) -> list[Any]:
    """What autogenerate would write to make the database equal the ORM models."""
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, migrations.target_metadata()))


def revision_of(engine: Engine) -> tuple[tuple[str, ...], list[int]]:
    """The store's Alembic revision and what its ``schema_version`` table says."""
    with engine.connect() as conn:
        heads = MigrationContext.configure(conn).get_current_heads()
        versions = list(conn.execute(text("SELECT version FROM schema_version")).scalars())
    return tuple(heads), versions


def test_a_new_store_is_built_by_the_migrations_and_equals_the_models(db_url: str) -> None:
    store = JobStore(db_url)
    try:
        assert revision_of(store.engine) == ((migrations.head(),), [SCHEMA_VERSION])
        assert schema_differences(store.engine) == []
        job = store.add_job(parse_spec({"name": "a", "command": "x", "workers": 2}))
        assert store.get_job(job.id) == job
    finally:
        store.close()
    again = JobStore(db_url)  # a second open finds the head and changes nothing
    try:
        assert [j.id for j in again.list_jobs()] == [job.id]
    finally:
        again.close()


def test_every_revision_step_applies_and_reverts(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        with engine.begin() as conn:
            command.upgrade(migrations.config(conn), "head")
            command.downgrade(migrations.config(conn), "base")
            assert set(inspect(conn).get_table_names()) <= {"alembic_version"}
    finally:
        engine.dispose()
    store = JobStore(db_url)
    try:
        assert schema_differences(store.engine) == []
    finally:
        store.close()


def test_a_drained_host_is_kept_across_a_reopen_and_its_table_reverts(db_url: str) -> None:
    store = JobStore(db_url)
    try:
        store.mark_draining("node-a", 100.0, leaves_at=130.0, source=DrainSource.NOTICE)
        store.mark_draining("node-b", 100.0, leaves_at=None, source=DrainSource.ADMIN)
        # A later notice with an earlier deadline brings it forward; a later one does not.
        store.mark_draining("node-a", 101.0, leaves_at=125.0, source=DrainSource.RAY)
        store.mark_draining("node-a", 102.0, leaves_at=200.0, source=DrainSource.ADMIN)
    finally:
        store.close()
    again = JobStore(db_url)
    try:
        assert again.drains() == {
            "node-a": HostDrain("node-a", 100.0, 125.0, DrainSource.RAY),
            "node-b": HostDrain("node-b", 100.0, None, DrainSource.ADMIN),
        }
        assert again.unmark_draining("node-b", 103.0)
        assert not again.unmark_draining("node-b", 104.0)
        assert list(again.drains()) == ["node-a"]
        assert [e.kind for e in again.events()][-1] == "undrain"
    finally:
        again.close()
    engine = create_engine(db_url)
    try:
        with engine.begin() as conn:
            command.downgrade(migrations.config(conn), "0009")
            assert "host_drains" not in inspect(conn).get_table_names()
            command.upgrade(migrations.config(conn), "head")
    finally:
        engine.dispose()


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def assert_record_holds_row(job: JobRecord, row: dict[str, Any]) -> None:
    """Every column of the release's row reads back as the same value."""
    for column, stored in row.items():
        if column == "spec":
            assert dict(job.spec_data) == _json(stored)
            assert job.spec.name == row["name"]
        elif column in ("slots", "release_slots"):
            assert [list(s) for s in getattr(job, column)] == sorted(_json(stored))
        elif column == "stopped_replicas":
            assert dict(job.stopped_replicas) == _json(stored)
        elif column == "labels":
            assert dict(job.labels) == _json(stored)
        elif column == "state":
            assert job.state is JobState(stored)
        elif column == "cancel_requested":
            assert job.cancel_requested is bool(stored)
        elif column == "change":
            assert stored == 0  # the listing's change number: not part of the record
        else:
            assert getattr(job, column) == stored, column


def copy_release_into(release: Path, url: str, version: int) -> None:
    """Lay out a database as the release left it: its tables (created by the baseline
    revision, which is that release's schema) holding the release store's rows, with no
    Alembic revision recorded."""
    engine = create_engine(url)
    source = create_engine(f"sqlite:///{release}")
    try:
        rows = dump(source)
        with engine.begin() as conn:
            command.upgrade(migrations.config(conn), "0001")
            conn.execute(text("DROP TABLE alembic_version"))
            if version == 1:
                conn.execute(text("DROP TABLE goodput"))
            meta = MetaData()
            meta.reflect(conn)
            postgres = engine.dialect.name == "postgresql"
            conn.execute(meta.tables["schema_version"].delete())
            for table in meta.sorted_tables:
                if rows.get(table.name):
                    conn.execute(table.insert(), rows[table.name])
                if postgres and "id" in table.c and table.c.id.autoincrement:
                    # What the release's own inserts would have left in the sequence.
                    conn.execute(
                        text(
                            f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), "
                            f"(SELECT max(id) FROM {table.name}))"
                        )
                    )
    finally:
        engine.dispose()
        source.dispose()


def as_revised(table: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A release's rows as the revisions after the baseline leave them: 0003 names the
    allocation counter ``reallocations`` and gives every job the single admin as owner;
    0005 numbers no change of a stored job (``change`` 0); 0006 makes every stored worker
    a replica of the one role a job had, ``worker``, at an unknown index; 0007 gives every
    job an empty list of slots to give up and no stopped replicas; 0008 records no further
    slot of any stored worker (each held one); 0009 names a job's bounds and target
    ``min_slots``, ``max_slots`` and ``target_slots``; 0010 records no actor (nor its
    source) of any stored event."""
    if table == "events":
        return [{**row, "actor": None, "source": None} for row in rows]
    if table == "workers":
        return [{**row, "role": "worker", "replica_index": None, "slots": []} for row in rows]
    if table != "jobs":
        return rows
    revised = []
    for row in rows:
        row = dict(row)
        row["reallocations"] = row.pop("generation")
        for kind in ("min", "max", "target"):
            row[f"{kind}_slots"] = row.pop(f"{kind}_workers")
        revised.append(
            {
                **row,
                "owner": "admin",
                "team": "default",
                "change": 0,
                "release_slots": [],
                "stopped_replicas": {},
            }
        )
    return revised


def check_upgraded(url: str, before: dict[str, list[dict[str, Any]]], version: int) -> None:
    """The release's store, opened by this release: every row there, readable, writable."""
    store = JobStore(url)
    try:
        after = dump(store.engine)
        assert revision_of(store.engine) == ((migrations.head(),), [SCHEMA_VERSION])
        assert schema_differences(store.engine) == []
        before = {table: as_revised(table, rows) for table, rows in before.items()}
        for table, rows in before.items():
            if table != "schema_version":
                assert after[table] == rows, table
        if version == 1:
            assert after["goodput"] == []
        assert after["requests"] == []
        assert after["host_drains"] == []  # 0011: no host was draining before
        # The single admin every stored job names becomes a user; no token is stored
        # (the server registers the data dir's token, hashed with its key, when it starts).
        assert [(u["name"], u["role"], u["team"]) for u in after["users"]] == [
            ("admin", "admin", "default")
        ]
        assert after["tokens"] == []
        assert after["sessions"] == []

        jobs = {j.name: j for j in store.list_jobs()}
        assert {j.state for j in jobs.values()} == set(JobState)
        for row in before["jobs"]:
            job = store.get_job(row["id"])
            assert job is not None
            assert_record_holds_row(job, row)
        assert jobs["rescaling"].slots == (("node-b", 0), ("node-b", 1), ("node-b", 2))
        assert jobs["failed"].restarts == 2
        assert jobs["cancelled"].cancel_requested
        assert jobs["running"].reallocations == next(
            r["reallocations"] for r in before["jobs"] if r["name"] == "running"
        )
        assert {(j.job.owner, j.job.team) for j in jobs.values()} == {("admin", "default")}
        running = jobs["running"]
        assert [(w.worker_id, w.slot, w.pid, w.state) for w in store.workers(running.id)] == [
            (0, ("node-a", 0), 4101, WorkerState.RUNNING),
            (1, ("node-a", 1), 4102, WorkerState.RUNNING),
        ]
        assert [w.exit_code for w in store.workers(jobs["failed"].id)] == [3]
        assert [(a.count, a.slots) for a in store.allocations(jobs["rescaling"].id)] == [
            (1, (("node-b", 0),)),
            (3, (("node-b", 0), ("node-b", 1), ("node-b", 2))),
        ]
        events = store.events()
        assert len(events) == len(before["events"])
        assert [e.kind for e in store.events(jobs["failed"].id)][-1] == "failed"
        assert store.events(jobs["failed"].id)[-1].data == {"exit_code": 3}
        assert [(m.step, m.values) for m in store.metrics(running.id)] == [
            (10, {"loss": 0.75, "accuracy": 0.5}),
            (20, {"loss": 0.5, "accuracy": 0.625}),
        ]
        if version == 2:
            assert store.goodput([running.id])[running.id].report == {
                "batch_size": 64,
                "efficiency": 0.875,
            }
        # The upgraded store takes new rows (ids and sequences continue where they were).
        new = store.add_job(parse_spec({"name": "after", "command": "x", "workers": 1}))
        store.update_job(new.id, slots=[("h", 0)], state=JobState.RUNNING)
        store.sync_workers(new.id, [WorkerStatus(0, ("h", 0), WorkerState.RUNNING, pid=1)])
        store.add_metrics(new.id, 1, {"loss": 1.0})
        store.set_goodput(new.id, {"batch_size": 8})
        store.add_request(new.id, SetPriority(7))
        assert [p.request for p in store.pending_requests()[new.id]] == [SetPriority(7)]
        assert len(store.events()) == len(before["events"]) + 1
        # The registry (revision 0012) starts empty and takes entries.
        assert store.datasets() == [] and store.models() == []
        store.add_dataset_version(DatasetIn(name="d", location="/data/d"), None, None)
        assert [v.version for v in store.datasets()[0].versions] == [1]
    finally:
        store.close()


@pytest.mark.parametrize("version", [1, 2])
def test_a_release_sqlite_store_upgrades_in_place(tmp_path: Path, version: int) -> None:
    path = tmp_path / "tidal.db"
    shutil.copy(RELEASES[version], path)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(version,)]
    before = dump(create_engine(f"sqlite:///{path}"))
    check_upgraded(f"sqlite:///{path}", before, version)
    # Through the data-dir entry point too, and a second time: nothing more to do.
    JobStore.open(tmp_path).close()


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2])
def test_a_release_postgres_store_upgrades_in_place(
    postgres_server: Postgres, version: int
) -> None:
    url = postgres_server.new_database()
    copy_release_into(RELEASES[version], url, version)
    engine = create_engine(url)
    try:
        before = dump(engine)
    finally:
        engine.dispose()
    assert len(before["jobs"]) == 6
    check_upgraded(url, before, version)


def _set_revision(url: str, revision: str) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})
    finally:
        engine.dispose()


def test_a_store_from_a_newer_release_is_refused_untouched(db_url: str) -> None:
    store = JobStore(db_url)
    store.add_job(parse_spec({"name": "a", "command": "x", "workers": 1}))
    store.close()
    _set_revision(db_url, "9999_from_the_future")
    engine = create_engine(db_url)
    try:
        before = dump(engine)
        with pytest.raises(migrations.StoreError, match="schema revision 9999_from_the_future"):
            JobStore(db_url)
        assert dump(engine) == before
        with engine.connect() as conn:
            heads = MigrationContext.configure(conn).get_current_heads()
        assert heads == ("9999_from_the_future",)
    finally:
        engine.dispose()


def test_a_store_of_an_unknown_schema_version_is_refused(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE schema_version (version INTEGER PRIMARY KEY)"))
            conn.execute(text("INSERT INTO schema_version VALUES (999)"))
        with pytest.raises(migrations.StoreError, match="schema version 999"):
            JobStore(db_url)
        assert set(inspect(engine).get_table_names()) == {"schema_version"}
    finally:
        engine.dispose()


def _store_opener(
    url: str, opened: list[JobStore], errors: list[BaseException]
) -> Callable[[], None]:
    """A thread target that opens the store at ``url`` into ``opened`` (or ``errors``)."""

    def open_store() -> None:
        try:
            opened.append(JobStore(url))
        except BaseException as e:  # reported by the caller
            errors.append(e)

    return open_store


def test_two_servers_creating_one_store_at_once_both_open_it(db_url: str) -> None:
    opened: list[JobStore] = []
    errors: list[BaseException] = []
    open_store = _store_opener(db_url, opened, errors)
    threads = [threading.Thread(target=open_store) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len(opened) == 2
    try:
        assert revision_of(opened[0].engine) == ((migrations.head(),), [SCHEMA_VERSION])
    finally:
        for s in opened:
            s.close()


@pytest.mark.slow
def test_a_server_starting_beside_a_long_migration_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A migration slower than the store's 5 s busy timeout (Alembic under load): the
    # second server waits for the first one's write lock instead of failing "locked".
    upgrade = command.upgrade
    migrating = threading.Event()

    def slow_upgrade(*args: Any, **kwargs: Any) -> None:
        migrating.set()
        time.sleep(6.0)
        upgrade(*args, **kwargs)

    monkeypatch.setattr(command, "upgrade", slow_upgrade)
    url = f"sqlite:///{tmp_path / 'tidal.db'}"
    opened: list[JobStore] = []
    errors: list[BaseException] = []
    open_store = _store_opener(url, opened, errors)
    first = threading.Thread(target=open_store)
    first.start()
    assert migrating.wait(30)
    second = threading.Thread(target=open_store)
    second.start()
    for t in (first, second):
        t.join(60)
    try:
        assert errors == []
        assert len(opened) == 2
        assert revision_of(opened[1].engine) == ((migrations.head(),), [SCHEMA_VERSION])
    finally:
        for store in opened:
            store.close()


def test_a_model_change_becomes_a_revision_that_applies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidal.controller.store.migrations.__main__ import main

    scripts = tmp_path / "migrations"
    shutil.copytree(
        migrations.SCRIPT_LOCATION, scripts, ignore=shutil.ignore_patterns("__pycache__")
    )
    monkeypatch.setattr(migrations, "SCRIPT_LOCATION", scripts)
    models = MetaData()
    for table in migrations.target_metadata().sorted_tables:
        table.to_metadata(models)
    models.tables["jobs"].append_column(Column("note", String(80), nullable=True))
    monkeypatch.setattr(migrations, "target_metadata", lambda: models)
    previous = migrations.head()
    following = f"{int(previous) + 1:04d}"

    main(["revision", "-m", "add job note"])
    written = scripts / "versions" / f"{following}_add_job_note.py"
    source = written.read_text()
    assert f"down_revision = '{previous}'" in source
    assert "add_column(sa.Column('note', sa.String(length=80), nullable=True))" in source
    assert "drop_column('note')" in source

    engine = create_engine(f"sqlite:///{tmp_path / 'tidal.db'}")
    try:
        migrations.upgrade(engine)
        with engine.connect() as conn:
            assert MigrationContext.configure(conn).get_current_heads() == (following,)
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(context, models) == []
    finally:
        engine.dispose()


def test_the_registry_keeps_lineage_both_ways_and_refuses_deleting_what_is_used(
    db_url: str,
) -> None:
    # Revision 0012's tables on each database: a run's output becomes a model version
    # pointing at its dataset version, which then names the version trained on it.
    store = JobStore(db_url)
    try:
        store.add_dataset_version(DatasetIn(name="digits", location="/data/a"), 10, "ab" * 32)
        second = store.add_dataset_version(DatasetIn(name="digits", location="/data/b"), 5, None)
        assert second.version == 2
        store.add_model(ModelIn(name="m", code="/code", entry_point="t.py", dataset="digits"))
        chosen = store.choose_dataset("digits", 1)
        job = store.add_job(
            parse_spec({"name": "m", "command": "x"}),
            run=ModelRun("m", {"lr": 0.5}, chosen.id, "/ckpt/1"),
        )
        store.add_metrics(job.id, 1, {"loss": 2.0, "accuracy": 0.5})
        store.add_metrics(job.id, 2, {"loss": 1.0})
        store.update_job(job.id, state=JobState.RUNNING)
        store.update_job(job.id, state=JobState.SUCCEEDED)
        (version,) = store.model_versions("m")
        assert (version.version, version.job_id, version.checkpoint) == (1, job.id, "/ckpt/1")
        assert version.metrics == {"loss": 1.0, "accuracy": 0.5}
        assert (version.params, version.dataset) == ({"lr": 0.5}, "digits:1")
        # A worker's last report may land after the job ended: the version takes it.
        store.add_metrics_many(job.id, [(3, 0.0, {"loss": 0.5})])
        assert store.model_versions("m")[0].metrics == {"loss": 0.5, "accuracy": 0.5}
        dataset = store.dataset("digits")
        assert dataset is not None
        assert [v.used_by for v in dataset.versions] == [["m:1"], []]
        store.set_alias("m", "champion", 1)
        assert store.model_versions("m")[0].aliases == ["champion"]
        with pytest.raises(RegistryConflict, match=r"version 1 trained model version m:1"):
            store.delete_dataset("digits", 1)
        store.delete_dataset("digits", 2)  # nothing uses it
        dataset = store.dataset("digits")
        assert dataset is not None and [v.version for v in dataset.versions] == [1]
    finally:
        store.close()


def test_servers_registering_one_new_dataset_at_once_number_its_versions(db_url: str) -> None:
    # Two connections inserting the same new dataset: one waits or retries, none fails,
    # and the versions are 1..n with none given twice.
    store = JobStore(db_url)
    start = threading.Barrier(4)
    numbers: list[int] = []
    errors: list[BaseException] = []

    def register(i: int) -> None:
        try:
            start.wait(30)
            body = DatasetIn(name="shared", location=f"/data/{i}")
            numbers.append(store.add_dataset_version(body, None, None).version)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=register, args=(i,)) for i in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        assert sorted(numbers) == [1, 2, 3, 4]
    finally:
        store.close()


def test_tokens_of_the_previous_release_upgrade_with_no_recorded_use(db_url: str) -> None:
    # A store at revision 0012 (the release before tokens' last use was kept) holding a
    # user's token: after the upgrade the token still identifies its user, never used.
    engine = create_engine(db_url)
    try:
        with engine.begin() as conn:
            command.upgrade(migrations.config(conn), "0012")
            conn.execute(
                text(
                    "INSERT INTO users (name, role, team, created_at) "
                    "VALUES ('ana', 'member', 'vision', 1.0)"
                )
            )
            conn.execute(
                text(
                    'INSERT INTO tokens (name, "user", digest, created_at) '
                    "VALUES ('laptop', 'ana', :d, 1.0)"
                ),
                {"d": "d" * 64},
            )
    finally:
        engine.dispose()
    store = JobStore(db_url)
    try:
        assert schema_differences(store.engine) == []
        [token] = store.tokens("ana")
        assert (token.name, token.last_used_at) == ("laptop", None)
        found = store.identify_token("d" * 64)
        assert found is not None and found.user.name == "ana"
        assert store.note_token_use(token.id, now=5.0)
        assert store.tokens("ana")[0].last_used_at == 5.0
    finally:
        store.close()
    engine = create_engine(db_url)
    try:
        with engine.begin() as conn:
            command.downgrade(migrations.config(conn), "0012")
            columns = {c["name"] for c in inspect(conn).get_columns("tokens")}
            assert "last_used_at" not in columns
            names = conn.execute(text("SELECT name FROM tokens")).scalars().all()
            assert names == ["laptop"]  # the downgrade keeps the tokens
            command.upgrade(migrations.config(conn), "head")
    finally:
        engine.dispose()
