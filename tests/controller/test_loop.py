"""The controller loop against the in-memory fake backend."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.controller.fakes import BrokenPolicy, FakeBackend, GreedyPolicy
from tidal.backends.base import DiscoveredHost
from tidal.controller.cluster import ClusterModel
from tidal.controller.loop.controller import Controller
from tidal.controller.store.jobs import JobRecord, JobStore
from tidal.controller.store.requests import SetPriority
from tidal.model import JobState, JobStateError
from tidal.spec import parse_spec


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    s = JobStore.open(tmp_path)
    yield s
    s.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make(
    store: JobStore, tmp_path: Path, clock: Clock, slots: int = 4, **kw: Any
) -> tuple[Controller, FakeBackend]:
    backend = kw.pop("backend", None) or FakeBackend()
    policy = kw.pop("policy", None) or GreedyPolicy()
    ctl = Controller(
        store, ClusterModel.single(slots, name="h"), policy, backend, tmp_path, clock=clock
    )
    return ctl, backend


def submit(store: JobStore, clock: Clock, name: str = "a", **fields: Any) -> JobRecord:
    spec = parse_spec({"name": name, "command": "python train.py", "workers": "1:4", **fields})
    clock.now += 1
    return store.add_job(spec, now=clock.now)


def job(store: JobStore, job_id: str) -> JobRecord:
    found = store.get_job(job_id)
    assert found is not None
    return found


def test_queued_job_starts_and_timeline_is_recorded(
    store: JobStore, tmp_path: Path, clock: Clock
) -> None:
    ctl, backend = make(store, tmp_path, clock)
    a = submit(store, clock, env={"SEED": "1"})
    ctl.tick()
    got = job(store, a.id)
    assert got.state is JobState.RUNNING
    assert got.slots == (("h", 0), ("h", 1), ("h", 2), ("h", 3))
    assert backend.calls == [("start", a.id, 4)]
    launch = backend.jobs[a.id].launch
    assert launch.argv == ("python", "train.py")
    assert launch.env["SEED"] == "1"
    assert launch.log_dir == tmp_path / "jobs" / a.id / "logs"
    assert launch.checkpoint_dir == tmp_path / "jobs" / a.id / "checkpoints"
    assert [(r.count, r.time) for r in store.allocations(a.id)] == [(4, clock.now)]
    assert [e.kind for e in store.events(a.id)] == ["submitted", "started"]
    assert [w.state.value for w in store.workers(a.id)] == []  # seen at the next poll
    ctl.tick()
    assert len(store.workers(a.id)) == 4


def test_checkpoint_dir_is_relative_to_working_dir(
    store: JobStore, tmp_path: Path, clock: Clock
) -> None:
    ctl, backend = make(store, tmp_path, clock)
    a = submit(store, clock, working_dir=str(tmp_path / "code"), checkpoint_dir="ckpt")
    ctl.tick()
    launch = backend.jobs[a.id].launch
    assert launch.working_dir == tmp_path / "code"
    assert launch.checkpoint_dir == tmp_path / "code" / "ckpt"


def test_higher_priority_job_shrinks_the_running_one(
    store: JobStore, tmp_path: Path, clock: Clock
) -> None:
    ctl, backend = make(store, tmp_path, clock, backend=FakeBackend(instant=False))
    low = submit(store, clock, "low")
    ctl.tick()
    backend.advance()
    ctl.tick()
    assert job(store, low.id).state is JobState.RUNNING
    high = submit(store, clock, "high", priority=9000, workers=2)
    clock.now += 1
    ctl.tick()
    assert job(store, low.id).state is JobState.RESCALING
    assert len(job(store, low.id).slots) == 2
    # The low job still runs on the slots it gives up: the newcomer must wait for them.
    assert job(store, high.id).state is JobState.QUEUED
    assert ("start", high.id, 2) not in backend.calls
    assert any(e.kind == "waiting" for e in store.events(high.id))
    ctl.tick()
    assert job(store, high.id).state is JobState.QUEUED
    backend.advance()
    clock.now += 2
    ctl.tick()
    assert job(store, low.id).state is JobState.RUNNING
    assert job(store, high.id).state is JobState.RUNNING
    backend.advance()
    assert backend.alive(low.id).isdisjoint(backend.alive(high.id))
    assert [r.count for r in store.allocations(low.id)] == [4, 2]
    assert [r.count for r in store.allocations(high.id)] == [2]
    assert ctl.metrics.registry.get_sample_value("tidal_rescales_total") == 1
    assert ctl.metrics.registry.get_sample_value(
        "tidal_rescale_stall_seconds_sum"
    ) == pytest.approx(2.0)


def test_preempted_to_zero_then_resumed(store: JobStore, tmp_path: Path, clock: Clock) -> None:
    ctl, backend = make(store, tmp_path, clock, slots=2)
    low = submit(store, clock, "low", workers="2:2")
    ctl.tick()
    high = submit(store, clock, "high", workers="2:2", priority=9000)
    ctl.tick()
    assert job(store, low.id).state is JobState.QUEUED
    assert job(store, low.id).reason.startswith("preempted")
    ctl.tick()
    assert job(store, high.id).state is JobState.RUNNING
    backend.finish(high.id)
    ctl.tick()
    assert job(store, high.id).state is JobState.SUCCEEDED
    ctl.tick()
    assert job(store, low.id).state is JobState.RUNNING
    assert [e.kind for e in store.events(low.id)][-1] == "resumed"
    assert [r.count for r in store.allocations(low.id)] == [2, 0, 2]
    # Preempted and resumed through the same backend job, not restarted from scratch.
    assert [c for c in backend.calls if c[1] == low.id] == [
        ("start", low.id, 2),
        ("assign", low.id, 0),
        ("assign", low.id, 2),
    ]
    # The finished job was stopped, which released what the backend held for it.
    assert ("stop", high.id, 0) in backend.calls and high.id not in backend.jobs


def test_failed_worker_is_replaced_within_max_restarts(
    store: JobStore, tmp_path: Path, clock: Clock
) -> None:
    ctl, backend = make(store, tmp_path, clock, slots=2)
    a = submit(store, clock, workers="2:2", restart={"max_restarts": 1})
    ctl.tick()
    ctl.tick()
    dead = backend.fail_worker(a.id)
    ctl.tick()
    got = job(store, a.id)
    assert got.restarts == 1
    assert got.state is JobState.RESCALING
    assert backend.calls[-1] == ("assign", a.id, 2)
    assert backend.alive(a.id) == set(got.slots)  # a fresh worker took the dead one's slot
    assert dead.slot in backend.alive(a.id)
    ctl.tick()
    assert job(store, a.id).state is JobState.RUNNING
    backend.fail_worker(a.id, exit_code=3)
    ctl.tick()
    got = job(store, a.id)
    assert got.state is JobState.FAILED
    assert got.restarts == 2
    assert "restart limit 1 reached" in got.reason
    assert got.slots == ()
    assert backend.calls[-1] == ("stop", a.id, 0)


def test_cancel_stops_workers(store: JobStore, tmp_path: Path, clock: Clock) -> None:
    ctl, backend = make(store, tmp_path, clock)
    a = submit(store, clock)
    queued = submit(store, clock, "b", workers=4)
    ctl.tick()
    store.update_job(a.id, cancel_requested=True)
    store.update_job(queued.id, cancel_requested=True)
    ctl.tick()
    assert job(store, a.id).state is JobState.CANCELLED
    assert job(store, queued.id).state is JobState.CANCELLED
    assert a.id in backend.stopped and a.id not in backend.jobs
    assert queued.id not in backend.stopped  # never started: nothing to stop


def test_lost_job_is_requeued_and_resumed(store: JobStore, tmp_path: Path, clock: Clock) -> None:
    ctl, backend = make(store, tmp_path, clock)
    a = submit(store, clock)
    ctl.tick()
    backend.forget(a.id)
    ctl.tick()
    # Requeued, then started again in the same tick's allocation.
    assert [e.kind for e in store.events(a.id)][-2:] == ["lost", "resumed"]
    assert job(store, a.id).state is JobState.RUNNING


def test_backend_failure_fails_the_job(store: JobStore, tmp_path: Path, clock: Clock) -> None:
    ctl, backend = make(store, tmp_path, clock)
    a = submit(store, clock)
    ctl.tick()
    backend.jobs[a.id].failed = True
    backend.jobs[a.id].reason = "no survivor and no checkpoint"
    ctl.tick()
    assert job(store, a.id).state is JobState.FAILED
    assert job(store, a.id).reason == "no survivor and no checkpoint"


def test_scale_out_rolls_back_after_deadline(store: JobStore, tmp_path: Path, clock: Clock) -> None:
    ctl, _ = make(store, tmp_path, clock)
    submit(store, clock, "big", workers="2:2", priority=9000)
    a = submit(store, clock, target={"group": None})
    ctl.tick()
    assert len(job(store, a.id).slots) == 2
    store.update_job(a.id, target_slots=4, scale_previous=None, scale_deadline=clock.now + 60)
    ctl.tick()
    assert len(job(store, a.id).slots) == 2
    assert job(store, a.id).scale_deadline is not None
    clock.now += 61
    ctl.tick()
    got = job(store, a.id)
    assert got.scale_deadline is None
    assert got.target_slots is None
    assert store.events(a.id)[-1].kind == "scale_out_rolled_back"


def test_scale_out_that_succeeds_clears_the_deadline(
    store: JobStore, tmp_path: Path, clock: Clock
) -> None:
    ctl, _ = make(store, tmp_path, clock)
    a = submit(store, clock)
    store.update_job(a.id, target_slots=2)
    ctl.tick()
    assert len(job(store, a.id).slots) == 2
    store.update_job(a.id, target_slots=3, scale_previous=2, scale_deadline=clock.now + 60)
    ctl.tick()
    ctl.tick()
    ctl.tick()
    got = job(store, a.id)
    assert len(got.slots) == 3
    assert got.scale_deadline is None
    assert got.target_slots == 3


def test_invalid_allocation_is_not_applied(store: JobStore, tmp_path: Path, clock: Clock) -> None:
    ctl, backend = make(store, tmp_path, clock, policy=BrokenPolicy())
    a = submit(store, clock)
    b = submit(store, clock, "b")
    ctl.tick()
    ctl.tick()  # the same problem again is not a second event
    assert backend.calls == []
    assert job(store, a.id).state is JobState.QUEUED
    assert job(store, b.id).state is JobState.QUEUED
    assert [e.kind for e in store.events() if e.job_id is None] == ["policy_error"]


def test_unplaceable_job_waits_with_a_reason(store: JobStore, tmp_path: Path, clock: Clock) -> None:
    ctl, backend = make(store, tmp_path, clock)
    a = submit(store, clock, target={"group": "a100"})
    ctl.tick()
    ctl.tick()
    got = job(store, a.id)
    assert got.state is JobState.QUEUED
    assert got.reason == "queued: no host is in group a100"
    assert [e.kind for e in store.events(a.id)] == ["submitted", "unplaceable"]
    assert backend.calls == []


def test_gauges_follow_the_store(store: JobStore, tmp_path: Path, clock: Clock) -> None:
    ctl, _ = make(store, tmp_path, clock)
    submit(store, clock, workers="3:3")
    submit(store, clock, "b", workers="3:3")
    ctl.tick()
    body, _ = ctl.metrics.render()
    text = body.decode()
    assert "tidal_slots_total 4.0" in text
    assert "tidal_slots_used 3.0" in text
    assert 'tidal_jobs{state="queued"} 1.0' in text
    assert 'tidal_jobs{state="running"} 1.0' in text


def test_controller_restart_reconciles_with_the_store(
    store: JobStore, tmp_path: Path, clock: Clock
) -> None:
    ctl, _ = make(store, tmp_path, clock)
    a = submit(store, clock, workers="2:2")
    ctl.tick()
    assert job(store, a.id).state is JobState.RUNNING
    # A new controller process: same store, a backend that has never heard of the job.
    again = JobStore(store.url)
    ctl2, backend2 = make(again, tmp_path, clock)
    ctl2.tick()
    got = job(again, a.id)
    assert got.state is JobState.RUNNING
    assert backend2.calls == [("start", a.id, 2)]
    assert [e.kind for e in again.events(a.id)][-2:] == ["lost", "resumed"]
    again.close()


class RaisingPolicy:
    name = "raising"

    def allocate(self, jobs: object, cluster: object, previous: object) -> dict[str, Any]:
        raise ZeroDivisionError("no slots to divide")


def test_policy_exception_is_an_event_and_the_loop_goes_on(
    store: JobStore, tmp_path: Path, clock: Clock
) -> None:
    ctl, backend = make(store, tmp_path, clock, policy=RaisingPolicy())
    a = submit(store, clock)
    ctl.tick()
    ctl.tick()
    assert backend.calls == []
    assert job(store, a.id).state is JobState.QUEUED
    errors = [e.message for e in store.events() if e.kind == "policy_error"]
    assert errors == ["ZeroDivisionError: no slots to divide"]
    ctl.policy = GreedyPolicy()
    ctl.tick()
    assert job(store, a.id).state is JobState.RUNNING


class DiscoveringBackend(FakeBackend):
    """The fake backend with hosts that come and go (a Ray cluster's nodes)."""

    def __init__(self, hosts: list[DiscoveredHost]) -> None:
        super().__init__()
        self.host_list = hosts

    def hosts(self) -> list[DiscoveredHost]:
        """The hosts as the test set them."""
        return list(self.host_list)


def test_hosts_follow_a_discovering_backend(store: JobStore, tmp_path: Path, clock: Clock) -> None:
    backend = DiscoveringBackend([DiscoveredHost("n1", 2), DiscoveredHost("n2", 2)])
    ctl, _ = make(store, tmp_path, clock, backend=backend)
    a = submit(store, clock, workers="1:4", restart={"max_restarts": 5})
    ctl.tick()
    assert ctl.cluster.total_slots == 4
    assert set(job(store, a.id).slots) == {("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)}
    ctl.tick()

    # n2 dies: its workers fail, its slots leave the cluster; the failed workers are not
    # replaced on it, and the job goes on with n1's slots.
    backend.host_list = [DiscoveredHost("n1", 2)]
    for _ in range(2):
        slot = next(
            w.slot for w in backend.jobs[a.id].workers if w.state.alive and w.slot[0] == "n2"
        )
        index = [w.slot for w in backend.jobs[a.id].workers if w.state.alive].index(slot)
        backend.fail_worker(a.id, index)
    ctl.tick()
    assert ctl.cluster.total_slots == 2
    assert backend.alive(a.id) == {("n1", 0), ("n1", 1)}
    assert job(store, a.id).restarts == 1, "a lost node is one failure, not one per worker"
    ctl.tick()
    assert set(job(store, a.id).slots) == {("n1", 0), ("n1", 1)}
    assert any(e.kind == "cluster" and "-n2" in e.message for e in store.events())

    # n3 joins: the job grows onto it.
    backend.host_list = [DiscoveredHost("n1", 2), DiscoveredHost("n3", 2)]
    ctl.tick()
    ctl.tick()
    assert set(job(store, a.id).slots) == {("n1", 0), ("n1", 1), ("n3", 0), ("n3", 1)}
    assert ctl.metrics.slots_total._value.get() == 4


def test_reports_are_stored_and_feed_the_policy(
    store: JobStore, tmp_path: Path, clock: Clock
) -> None:
    from tidal.launch.api import MetricPoint
    from tidal.policy.api import Cluster, JobRequest, Slot

    seen: list[JobRequest] = []

    class Spy(GreedyPolicy):
        def allocate(
            self, jobs: Any, cluster: Cluster, previous: Any
        ) -> dict[str, tuple[Slot, ...]]:
            seen.extend(jobs)
            return super().allocate(jobs, cluster, previous)

    ctl, backend = make(store, tmp_path, clock, policy=Spy())
    a = submit(store, clock)
    ctl.tick()
    backend.report(
        a.id,
        [MetricPoint(5, 1.0, {"loss": 0.5}), MetricPoint(10, 2.0, {"loss": 0.25})],
        {
            "model": {
                "alpha_compute": 0.1,
                "beta_compute": 0.01,
                "alpha_sync_local": 0.0,
                "beta_sync_local": 0.0,
                "alpha_sync_node": 0.0,
                "beta_sync_node": 0.0,
                "grad_noise_scale": 500.0,
                "init_batch_size": 64,
            },
            "batch_size": 128,
            "efficiency": 0.9,
            "speedup": 3.5,
        },
    )
    seen.clear()
    ctl.tick()
    assert [(m.step, m.values["loss"]) for m in store.metrics(a.id)] == [(5, 0.5), (10, 0.25)]
    model = seen[0].throughput
    assert model is not None and model.grad_noise_scale == 500.0
    assert model.init_batch_size == 64
    assert store.goodput()[a.id].report["batch_size"] == 128
    ctl.tick()  # handed over once: nothing is stored twice
    assert len(store.metrics(a.id)) == 2


def test_job_is_held_at_its_initial_size_until_scaled(
    store: JobStore, tmp_path: Path, clock: Clock
) -> None:
    from tidal.controller.store.requests import Resize

    ctl, backend = make(store, tmp_path, clock, slots=8)
    a = submit(store, clock, workers={"min": 1, "max": 8, "initial": 2})
    ctl.tick()
    assert backend.calls == [("start", a.id, 2)]
    assert len(job(store, a.id).slots) == 2
    ctl.tick()
    # Started, it stays at its target (Arena's --workers) though idle slots are left.
    assert len(job(store, a.id).slots) == 2
    store.add_request(a.id, Resize(3, "scale_out"))  # `tidal scale-out --count 1`
    ctl.tick()
    ctl.tick()
    assert len(job(store, a.id).slots) == 3
    # A job without one grows into the idle slots (greedy: all it may).
    b = submit(store, clock, "b", workers="1:8")
    ctl.tick()
    ctl.tick()
    assert len(job(store, b.id).slots) == 5


def test_requests_wait_for_the_next_tick_and_apply_in_order(
    store: JobStore, tmp_path: Path, clock: Clock
) -> None:
    from tidal.controller.store.requests import Resize, SetPriority

    ctl, _ = make(store, tmp_path, clock)
    a = submit(store, clock)
    ctl.tick()
    store.add_request(a.id, SetPriority(7000))
    store.add_request(a.id, Resize(3, "scale_out", deadline=clock.now + 60))
    store.add_request(a.id, Resize(2, "scale_in"))
    assert job(store, a.id).priority == 5000 and job(store, a.id).target_slots is None
    ctl.tick()
    got = job(store, a.id)
    # The later resize wins and, being no scale-out, leaves no deadline behind.
    assert (got.priority, got.target_slots, got.scale_deadline) == (7000, 2, None)
    assert len(got.slots) == 2
    assert store.pending_requests() == {}


def test_requests_of_a_job_that_ends_are_dropped(
    store: JobStore, tmp_path: Path, clock: Clock
) -> None:
    from tidal.controller.store.requests import Cancel, SetPriority

    ctl, backend = make(store, tmp_path, clock)
    a = submit(store, clock)
    ctl.tick()
    backend.finish(a.id)
    store.add_request(a.id, SetPriority(7000))
    ctl.tick()
    assert job(store, a.id).state is JobState.SUCCEEDED
    assert store.pending_requests() == {}
    with pytest.raises(JobStateError):
        store.add_request(a.id, Cancel(), expect=[JobState.QUEUED, JobState.RUNNING])


def _until(check: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_request_wakes_the_loop(store: JobStore, tmp_path: Path, clock: Clock) -> None:
    ctl, _ = make(store, tmp_path, clock)
    ctl.start(interval=60.0)
    try:
        ticks = ctl.metrics.registry.get_sample_value
        assert _until(lambda: ticks("tidal_controller_ticks_total") == 1)
        a = submit(store, clock)
        # Well within the 60 s interval: the submission woke the loop.
        assert _until(lambda: job(store, a.id).state is JobState.RUNNING)
        store.add_request(a.id, SetPriority(9000))
        assert _until(lambda: job(store, a.id).priority == 9000)
    finally:
        ctl.stop()


def test_a_released_slot_moves_as_soon_as_its_worker_exits(
    store: JobStore, tmp_path: Path, clock: Clock
) -> None:
    ctl, backend = make(store, tmp_path, clock, backend=FakeBackend(instant=False))
    low = submit(store, clock, "low")
    ctl.tick()
    backend.advance()
    ctl.tick()
    ctl.start(interval=60.0)
    try:
        high = submit(store, clock, "high", priority=9000, workers=2)
        assert _until(lambda: len(job(store, low.id).slots) == 2)
        assert job(store, high.id).state is JobState.QUEUED  # the released workers still run
        with ctl._lock:  # the released workers exit, between two ticks
            backend.advance()
        # Not an interval later: the loop looks again soon while a slot is being handed over.
        assert _until(lambda: job(store, high.id).state is JobState.RUNNING)
        with ctl._lock:
            backend.advance()
            assert backend.alive(low.id).isdisjoint(backend.alive(high.id))
            assert len(backend.alive(high.id)) == 2
    finally:
        ctl.stop()
