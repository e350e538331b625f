"""The job model: built from a spec, its roles, and the state machine's transitions."""

from __future__ import annotations

from dataclasses import replace
from typing import get_args

import pytest

from tidal.controller.loop.deadlines import DeadlineMet, DeadlineMissed, decide_deadline
from tidal.controller.store.jobs import JobRecord, JobStore
from tidal.controller.store.requests import (
    Cancel,
    PendingRequest,
    Resize,
    SetPriority,
    StopWorkers,
    UserRequest,
    apply_requests,
    request_from_row,
    request_to_row,
)
from tidal.model import (
    TRANSITIONS,
    WORKER_ROLE,
    Job,
    JobState,
    JobStateError,
    Launcher,
    Replicas,
    Role,
    check_transition,
    job_from_spec,
)
from tidal.spec import parse_spec
from tidal.spec_roles import LAUNCHERS, LauncherName


def test_a_spec_becomes_a_one_role_job() -> None:
    spec = parse_spec(
        {
            "name": "mnist",
            "command": "python train.py --lr 0.1",
            "env": {"SEED": "1"},
            "workers": {"min": 2, "max": 8, "initial": 4},
            "resources": {"cpus": 2, "memory": "1Gi"},
            "target": {"group": "a100", "labels": {"ib": "yes"}},
            "restart": {"max_restarts": 5},
            "checkpoint_dir": "ckpt",
            "labels": {"team": "nlp"},
        }
    )
    job = job_from_spec(spec)
    assert [r.name for r in job.roles] == [WORKER_ROLE]
    role = job.role
    assert role.command == ("python", "train.py", "--lr", "0.1")
    assert role.replicas == Replicas(min=2, max=8, initial=4)
    assert (role.resources.cpus, role.resources.memory) == (2.0, 2**30)
    assert role.restart.max_restarts == 5
    assert role.launcher.value == "tidal"
    assert (job.placement.group, dict(job.placement.labels)) == ("a100", {"ib": "yes"})
    assert (job.owner, job.team) == ("admin", "default")
    assert job.checkpointing.dir == "ckpt"
    # Without `initial`, a job starts at its maximum, as the spec documents.
    assert (
        job_from_spec(
            parse_spec({"name": "x", "command": "a", "workers": "1:3"})
        ).role.replicas.initial
        == 3
    )


def test_roles_need_distinct_names_and_sane_replicas() -> None:
    worker = Role(name="worker", command=("a",))
    with pytest.raises(ValueError, match="distinct names"):
        Job(name="x", roles=(worker, worker))
    with pytest.raises(ValueError, match="distinct names"):
        Job(name="x", roles=())
    with pytest.raises(ValueError, match="min ≤ initial ≤ max"):
        Replicas(min=2, max=4, initial=1)
    ps = Role(name="ps", command=("b",))
    job = Job(name="x", roles=(worker, ps))
    assert job.role_named("ps") is ps
    with pytest.raises(KeyError):
        job.role_named("chief")


@pytest.mark.parametrize(
    ("launcher", "group", "restarts", "replicas", "fixed"),
    [
        (Launcher.TIDAL, True, False, False, False),
        (Launcher.TORCHRUN, True, True, False, False),
        (Launcher.TF, False, False, True, True),
        (Launcher.MPI, False, False, True, False),
        (Launcher.PS, False, False, True, False),
    ],
)
def test_what_each_launcher_implies(
    launcher: Launcher, group: bool, restarts: bool, replicas: bool, fixed: bool
) -> None:
    assert (
        launcher.forms_group,
        launcher.restart_based,
        launcher.runs_replicas,
        launcher.fixed_count,
    ) == (group, restarts, replicas, fixed)


@pytest.mark.parametrize(
    ("old", "new", "legal"),
    [
        (JobState.QUEUED, JobState.RUNNING, True),
        (JobState.QUEUED, JobState.RESCALING, False),
        (JobState.RUNNING, JobState.RESCALING, True),
        (JobState.RESCALING, JobState.RUNNING, True),
        (JobState.RESCALING, JobState.QUEUED, True),
        (JobState.RUNNING, JobState.SUCCEEDED, True),
        (JobState.SUCCEEDED, JobState.RUNNING, False),
        (JobState.CANCELLED, JobState.QUEUED, False),
        (JobState.FAILED, JobState.FAILED, True),
    ],
)
def test_transitions(old: JobState, new: JobState, legal: bool) -> None:
    assert (new is old or new in TRANSITIONS[old]) is legal
    if legal:
        check_transition("j", old, new)
    else:
        with pytest.raises(JobStateError, match=f"cannot become {new.value}"):
            check_transition("j", old, new)


def test_the_store_refuses_an_illegal_transition() -> None:
    store = JobStore("sqlite://")
    job = store.add_job(parse_spec({"name": "x", "command": "a"}))
    store.update_job(job.id, state=JobState.CANCELLED)
    with pytest.raises(JobStateError, match="cannot become running"):
        store.update_job(job.id, state=JobState.RUNNING)
    got = store.get_job(job.id)
    assert got is not None and got.state is JobState.CANCELLED
    store.close()


def _pending(*requests: UserRequest) -> list[PendingRequest]:
    return [PendingRequest(i, "j", float(i), r) for i, r in enumerate(requests)]


def _record(workers: str | int, target: int | None = None, held: int = 2) -> JobRecord:
    """A stored job of ``workers`` holding ``held`` slots ``h:0 ..``."""
    store = JobStore("sqlite://")
    job = store.add_job(parse_spec({"name": "j", "command": "a", "workers": workers}))
    store.close()
    return replace(job, target_slots=target, slots=tuple(("h", i) for i in range(held)))


def test_requests_apply_in_order() -> None:
    job = _record("1:4", target=2)
    decided = apply_requests(job, _pending(SetPriority(7), Resize(4, "scale_out", 99.0)))
    assert decided.changes == {
        "priority": 7,
        "target_slots": 4,
        "scale_deadline": 99.0,
        "scale_previous": 2,
    }
    assert decided.applied == (0, 1)
    later = apply_requests(job, _pending(Resize(4, "scale_out", 99.0), Resize(3), Cancel()))
    assert later.changes == {
        "target_slots": 3,
        "scale_deadline": None,
        "scale_previous": None,
        "cancel_requested": True,
    }
    assert apply_requests(_record("1:4"), []).changes == {}


def test_stopping_workers_lowers_a_fixed_job_and_names_the_slots_it_gives_up() -> None:
    job = _record(4, held=4)
    first = StopWorkers((1,), (("h", 1),), "worker", fixed=True)
    again = StopWorkers((1, 3), (("h", 1), ("h", 3)), "worker", fixed=True)  # 1 asked twice
    decided = apply_requests(job, _pending(first, again))
    assert decided.changes == {
        "min_slots": 2,
        "max_slots": 2,
        "target_slots": None,
        "stopped_replicas": {"worker": 2},
        "release_slots": (("h", 1), ("h", 3)),
    }
    # Its model runs that many fewer workers from then on.
    lowered = replace(job, stopped_replicas={"worker": 2})
    assert (job.job.slot_range.max, lowered.job.slot_range) == (4, Replicas(2, 2, 2))


def test_stopping_workers_of_an_elastic_job_lowers_its_target_from_what_it_holds() -> None:
    job = _record("1:4", held=3)
    decided = apply_requests(job, _pending(StopWorkers((0,), (("h", 0),), "worker", fixed=False)))
    assert decided.changes == {
        "target_slots": 2,
        "scale_deadline": None,
        "scale_previous": None,
        "release_slots": (("h", 0),),
    }
    assert job.job.slot_range == Replicas(1, 4, 4)  # its range is the spec's still


def test_requests_round_trip_through_rows() -> None:
    for request in (
        SetPriority(3),
        Resize(2, "scale_in"),
        Resize(5, "scale_out", 1.5),
        StopWorkers((1, 4), (("h", 1), ("g", 0)), "worker", fixed=True),
        Cancel(),
    ):
        assert request_from_row(*request_to_row(request)) == request
    # A resize stored by the release before names its slot count ``workers``.
    assert request_from_row("resize", {"workers": 3, "how": "scale"}) == Resize(3)
    with pytest.raises(ValueError, match="unknown request kind"):
        request_from_row("reboot", {})


def test_deadline_decisions() -> None:
    store = JobStore("sqlite://")
    job = store.add_job(parse_spec({"name": "x", "command": "a", "workers": "1:4"}), now=0.0)
    assert decide_deadline(job, 10.0) is None
    job = store.update_job(
        job.id,
        1.0,
        slots=[("h", 0)],
        state=JobState.RUNNING,
        target_slots=3,
        scale_previous=1,
        scale_deadline=60.0,
    )
    assert decide_deadline(job, 59.0) is None
    assert decide_deadline(job, 60.0) == DeadlineMissed(target=3, restored=1)
    grown = store.update_job(job.id, 2.0, slots=[("h", 0), ("h", 1), ("h", 2)])
    assert decide_deadline(grown, 30.0) == DeadlineMet(slots=3)
    store.close()


def test_the_spec_names_exactly_the_model_s_launchers() -> None:
    # The spec sits below the model and spells the names itself; a launcher added to one
    # and not the other would be accepted and then not run, or run and never accepted.
    assert (
        set(LAUNCHERS) == set(get_args(LauncherName)) == {launcher.value for launcher in Launcher}
    )
