"""Every group is a :class:`Group`; ``tidal run``'s orders drive a job's group through
:class:`GroupDriver`, as the backends' do."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

import tidal.launch.driver as driver_module
from tidal.launch.api import RoleLaunch
from tidal.launch.driver import GroupDriver
from tidal.launch.groups.api import Group, GroupEvent, JobGroup, Outcome
from tidal.launch.groups.elastic import WorkerGroup
from tidal.launch.groups.replicas import ReplicaSet
from tidal.launch.groups.roles import RoleGroups
from tidal.launch.groups.torchrun import TorchrunGroup
from tidal.launch.run import RunControl, RunOptions, resized_slots
from tidal.launch.worker import Worker, WorkerPhase, WorkerSpec
from tidal.runtime.rendezvous import (
    Generation,
    RendezvousClient,
    RendezvousHost,
    connect_store,
    request_resize,
)

POOL = ["local:0", "local:1", "local:2", "local:3"]


def _spec(launcher: str = "tidal") -> WorkerSpec:
    return WorkerSpec(argv=["unused"], job_id="protocol", launcher=launcher)


def test_all_four_groups_are_groups_and_the_job_level_ones_host_the_store(tmp_path: Path) -> None:
    roles = [RoleLaunch(name="worker", argv=("unused",), min=1, max=1, launcher="tf")]
    job_groups: list[object] = [
        WorkerGroup(_spec()),
        TorchrunGroup(_spec("torchrun")),
        RoleGroups(_spec(), roles, work_dir=tmp_path),
    ]
    replicas = ReplicaSet(_spec("tf"))
    for group in [*job_groups, replicas]:
        assert isinstance(group, Group), type(group).__name__
    for group in job_groups:
        assert isinstance(group, JobGroup), type(group).__name__
    assert not isinstance(replicas, JobGroup)  # it uses the job's store, hosts none


def test_a_replica_set_is_settled_once_a_replica_runs_on_each_assigned_slot() -> None:
    replicas = ReplicaSet(_spec("tf"))
    assert replicas.settled()
    replicas.assign(["h:0", "h:1"])
    assert not replicas.settled()
    for slot in ("h:0", "h:1"):
        process = SimpleNamespace(pid=1, poll=lambda: None)
        replicas.workers[slot] = Worker(slot, slot, process, phase=WorkerPhase.MEMBER)
    assert replicas.settled()
    replicas.assign(["h:0"])
    assert not replicas.settled()  # the replica on h:1 is still to stop


def test_resized_slots_keep_the_members_first_then_fill_from_the_pool() -> None:
    members = ["local:1", "local:0"]
    assert resized_slots(members, members, 1, POOL) == ["local:1"]
    assert resized_slots(members, members, 3, POOL) == ["local:1", "local:0", "local:2"]
    # A slot asked for but not a member yet stays asked for before new pool slots.
    assert resized_slots(["local:0"], ["local:0", "local:3"], 3, POOL) == [
        "local:0",
        "local:3",
        "local:1",
    ]


class _Group:
    """A job's group whose workers never run: it records what it is assigned and ends
    when told to."""

    def __init__(self, members: Sequence[str] = ()) -> None:
        self.host = RendezvousHost()
        self.workers: dict[str, Worker] = {}
        for i, m in enumerate(members):
            process: Any = SimpleNamespace(pid=100 + i)
            self.workers[m] = Worker(m, f"local:{i}", process, phase=WorkerPhase.MEMBER)
        self.generation: Generation | None = Generation(0, tuple(members)) if members else None
        self.outcome: Outcome | None = None
        self.assigned: list[list[str]] = []
        self.failed_with = ""
        #: Polls left before the group succeeds by itself.
        self.polls_left = 1000

    def start(self, slots: Sequence[str]) -> None:
        self.assign(slots)

    def assign(self, slots: Sequence[str]) -> None:
        self.assigned.append(list(slots))

    def poll(self) -> Outcome | None:
        self.polls_left -= 1
        if self.outcome is None and self.polls_left <= 0:
            self.outcome = Outcome.SUCCEEDED
        return self.outcome

    def poll_interval(self) -> float:
        return 0.001

    def settled(self) -> bool:
        return True

    def fail(self, reason: str) -> None:
        self.failed_with = reason
        self.outcome = Outcome.FAILED

    def stop(self, grace: float = 30.0) -> None:
        if self.outcome is None:
            self.outcome = Outcome.STOPPED


def _drive(
    group: _Group,
    monkeypatch: pytest.MonkeyPatch,
    failures: list[Worker],
    **options: Any,
) -> tuple[RunControl, list[GroupEvent], Any]:
    monkeypatch.setattr(driver_module, "make_group", lambda spec, **_: group)
    driver = GroupDriver("run", _spec())
    assert driver.group is group
    run_options = RunOptions(command=["unused"], min_workers=1, max_workers=4, **options)
    events: list[GroupEvent] = []
    console = Console(file=io.StringIO())
    control = RunControl(group, run_options, POOL, failures, show=events.append, console=console)
    driver.start(control.desired)
    return control, events, driver.drive(control)


def test_the_driver_applies_a_tidal_resize_request(monkeypatch: pytest.MonkeyPatch) -> None:
    group = _Group(["w0", "w1"])
    host, port = group.host.address.rsplit(":", 1)
    request_resize(connect_store(host, int(port), timeout=10), 9)  # clamped to the maximum
    group.polls_left = 20
    control, events, final = _drive(group, monkeypatch, [], initial=2)
    assert group.assigned == [POOL[:2], POOL]
    assert [e.message for e in events if e.kind == "resize"] == ["asked for 4 workers"]
    assert final.finished and control.desired == POOL


def test_the_driver_follows_the_plan_once_the_step_is_reached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = _Group(["w0", "w1"])
    RendezvousClient(group.host.store, "w0").report_progress(30, 0, 0, 2)  # rank 0's step
    group.polls_left = 20
    _, events, _ = _drive(group, monkeypatch, [], initial=2, resize_plan=[(25, 1), (90, 3)])
    assert group.assigned == [POOL[:2], POOL[:1]]
    assert [e.message for e in events if e.kind == "resize"] == ["step 25: asked for 1 workers"]


def test_a_failed_worker_is_replaced_within_the_budget_then_the_run_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = _Group(["w0", "w1"])
    lost = group.workers["w1"]
    lost.phase, lost.exit_code, lost.failed = WorkerPhase.EXITED, 1, True
    failures = [lost]
    group.polls_left = 20
    control, events, final = _drive(group, monkeypatch, failures, initial=2, max_restarts=1)
    assert group.assigned == [POOL[:2], POOL[:2]]  # the same slots: a fresh worker on w1's
    assert [e.kind for e in events] == ["restart"]
    assert control.restarts == 1 and final.finished

    group = _Group(["w0", "w1"])
    group.workers["w1"].exit_code = 1
    control, _, final = _drive(group, monkeypatch, [group.workers["w1"]], initial=2, max_restarts=0)
    assert group.failed_with.endswith("restart limit 0 reached")
    assert final.failed and control.restarts == 1
