"""A job's status as Kubeflow shows it: replicas per role and conditions (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.cli.roles import replica_worker
from tidal.controller.routes.job_status import conditions, role_statuses
from tidal.controller.store.jobs import JobStore
from tidal.controller.store.records import EventRecord, WorkerRecord
from tidal.launch.api import WorkerState
from tidal.model import JobState
from tidal.spec import parse_spec
from tidal.wire.schema import JobDetail, RoleStatusView, WorkerView

SPEC = {
    "name": "ps-job",
    "roles": [
        {"name": "ps", "command": ["python", "t.py"], "replicas": 2, "launcher": "ps"},
        {"name": "worker", "command": ["python", "t.py"], "replicas": "1:4", "launcher": "ps"},
    ],
}


def _worker(
    wid: int, role: str, index: int, state: WorkerState, code: int | None = None
) -> WorkerRecord:
    return WorkerRecord("j", wid, ("h", wid), 100 + wid, state, code, 0.0, role, index)


def _event(i: int, kind: str, message: str = "") -> EventRecord:
    return EventRecord(i, "j", float(i), kind, message, {})


def test_role_counts_follow_the_workers_and_the_slots(tmp_path: Path) -> None:
    store = JobStore.open(tmp_path / "data")
    try:
        record = store.add_job(parse_spec(SPEC), now=0.0)
        record = store.update_job(
            record.id, 1.0, state=JobState.RUNNING, slots=tuple(("h", i) for i in range(5))
        )
    finally:
        store.close()
    workers = [
        _worker(0, "ps", 0, WorkerState.RUNNING),
        _worker(1, "ps", 1, WorkerState.FAILED, 3),
        _worker(2, "worker", 0, WorkerState.EXITED, 0),
        _worker(3, "worker", 1, WorkerState.RUNNING),
        _worker(4, "worker", 2, WorkerState.STARTING),
        _worker(5, "ps", 1, WorkerState.RUNNING),  # the failed server, restarted
    ]
    got = [
        (r.name, r.replicas, r.active, r.succeeded, r.failed)
        for r in role_statuses(record.job, record, workers)
    ]
    # 5 slots: 2 fixed servers, so the elastic workers want 3 now.
    assert got == [("ps", 2, 2, 0, 1), ("worker", 3, 2, 1, 0)]


def test_conditions_from_the_events(tmp_path: Path) -> None:
    store = JobStore.open(tmp_path / "data")
    try:
        record = store.add_job(parse_spec(SPEC), now=0.0)
        failed = store.update_job(record.id, 9.0, state=JobState.RUNNING)
        failed = store.update_job(record.id, 9.0, state=JobState.FAILED, reason="boom")
    finally:
        store.close()
    events = [
        _event(1, "submitted"),
        _event(2, "started", "3 worker(s)"),
        _event(3, "rescaled"),  # settling while running changes nothing
        _event(4, "worker_failed", "worker 1 failed; replacing it"),
        _event(5, "rescaled", "now 3 worker(s)"),
        _event(6, "failed", "boom"),
    ]
    got = [(c.type, c.status, c.reason, c.message, c.time) for c in conditions(failed, events)]
    assert got == [
        ("Created", "True", "JobCreated", "", 1.0),  # the submitted event's time
        ("Running", "False", "JobRunning", "now 3 worker(s)", 5.0),
        ("Restarting", "False", "JobRestarting", "worker 1 failed; replacing it", 4.0),
        ("Failed", "True", "JobFailed", "boom", 6.0),
    ]
    running = [(c.type, c.status) for c in conditions(failed, events[:5])]
    assert running == [("Created", "True"), ("Running", "True"), ("Restarting", "False")]


def _detail(workers: list[WorkerView]) -> JobDetail:
    roles = [
        RoleStatusView(name=n, replicas=1, active=1, succeeded=0, failed=0)
        for n in ("ps", "worker")
    ]
    return JobDetail.model_construct(id="j", worker_list=workers, roles=roles)


def test_a_replica_is_its_latest_worker() -> None:
    def view(wid: int, role: str, index: int) -> WorkerView:
        return WorkerView(
            worker_id=wid,
            host="h",
            slot=wid,
            pid=None,
            state="running",
            exit_code=None,
            role=role,
            index=index,
        )

    detail = _detail([view(0, "ps", 0), view(1, "worker", 0), view(2, "worker", 0)])
    assert replica_worker(detail, "worker", 0) == 2
    assert replica_worker(detail, "ps", 0) == 0
    with pytest.raises(
        ValueError, match=r"^--role: job j has no role 'chief' \(roles: ps, worker\)"
    ):
        replica_worker(detail, "chief", 0)
    with pytest.raises(
        ValueError, match=r"^--index: role 'ps' has had no replica 3 \(replicas seen: 0\)"
    ):
        replica_worker(detail, "ps", 3)
