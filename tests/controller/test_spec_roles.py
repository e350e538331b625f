"""Multi-role specs: parsing, the job they build, and what a server refuses to run."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.controller.conftest import Served
from tidal.backends.base import ONE_GROUP
from tidal.client import InvalidRequest
from tidal.controller.cluster import ClusterHost, ClusterModel
from tidal.controller.support import too_wide, unsupported
from tidal.model import Job, Launcher, RestartKind, job_from_spec
from tidal.spec import SpecError, parse_spec, parse_spec_yaml

TF_SPEC = """
name: tf-digits
env: {SEED: "1", SHARED: job}
working_dir: /srv/job
restart: {max_restarts: 5}
roles:
  - name: chief
    command: python train.py --role chief
    launcher: tf
    ends_job: true
    restart: Never
  - name: ps
    command: [python, train.py, --role, ps]
    replicas: 2
    resources: {gpus: 0, cpus: 2, memory: 1Gi}
    launcher: tf
  - name: worker
    command: python train.py --role worker
    env: {SHARED: worker}
    working_dir: /srv/worker
    replicas: "1:4"
    resources: {gpus: 2}
    restart: {policy: ExitCode, max_restarts: 9}
    launcher: tf
"""


def test_every_role_is_built_with_its_own_fields_and_the_jobs_defaults() -> None:
    job = job_from_spec(parse_spec_yaml(TF_SPEC))
    chief, ps, worker = job.roles
    assert [r.name for r in job.roles] == ["chief", "ps", "worker"]
    assert chief.command == ("python", "train.py", "--role", "chief")
    assert chief.env == {"SEED": "1", "SHARED": "job"}
    assert worker.env == {"SEED": "1", "SHARED": "worker"}  # the role's own value wins
    assert (chief.working_dir, worker.working_dir) == ("/srv/job", "/srv/worker")
    assert (ps.replicas.min, ps.replicas.max, ps.replicas.elastic) == (2, 2, False)
    assert (worker.replicas.min, worker.replicas.max, worker.replicas.initial) == (1, 4, 4)
    assert (ps.resources.gpus, ps.resources.cpus, ps.resources.memory) == (0, 2.0, 2**30)
    assert worker.resources.gpus == 2
    assert chief.restart.policy is RestartKind.NEVER and chief.restart.max_restarts == 5
    assert ps.restart.policy is RestartKind.ON_FAILURE
    assert (worker.restart.policy, worker.restart.max_restarts) == (RestartKind.EXIT_CODE, 9)
    assert {r.launcher for r in job.roles} == {Launcher.TF}
    # One role says it ends the job: the others then do not.
    assert [r.ends_job for r in job.roles] == [True, False, False]
    assert job.role is worker  # the elastic role is the one that scales


def test_when_no_role_says_every_role_ends_the_job() -> None:
    spec = parse_spec(
        {"name": "x", "roles": [{"name": "a", "command": "a"}, {"name": "b", "command": "b"}]}
    )
    assert [r.ends_job for r in job_from_spec(spec).roles] == [True, True]


def test_a_one_role_spec_is_stored_exactly_as_before() -> None:
    spec = parse_spec({"name": "mnist", "command": "python t.py", "workers": "1:4"})
    stored = spec.model_dump(mode="json")
    assert "roles" not in stored and stored["command"] == ["python", "t.py"]
    job = job_from_spec(spec)
    assert [r.name for r in job.roles] == ["worker"] and job.role.launcher is Launcher.TIDAL
    assert unsupported(job, named_roles=False) == []


def test_a_spec_with_roles_round_trips_through_its_stored_form() -> None:
    spec = parse_spec_yaml(TF_SPEC)
    stored = json.loads(json.dumps(spec.model_dump(mode="json")))
    assert not {"command", "workers", "resources"} & set(stored)
    assert parse_spec(stored) == spec


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"name": "x", "command": "a", "roles": [{"name": "w", "command": "b"}]},
            [("command", "not used with roles: give each role its own command (roles[i].command)")],
        ),
        (
            {"name": "x", "workers": 2, "roles": [{"name": "w", "command": "b"}]},
            [
                (
                    "workers",
                    "not used with roles: give each role its own replica count (roles[i].replicas)",
                )
            ],
        ),
        (
            {"name": "x", "roles": [{"name": "w", "command": "b"}, {"name": "w", "command": "c"}]},
            [("roles[1].name", "'w' is already roles[0]")],
        ),
        (
            {
                "name": "x",
                "roles": [
                    {"name": "a", "command": "b", "replicas": "1:2"},
                    {"name": "b", "command": "c", "replicas": "2:8"},
                ],
            },
            [
                (
                    "roles[1].replicas",
                    "only one role may be elastic (MIN:MAX); roles[0] 'a' already is: "
                    "give this one a fixed count",
                )
            ],
        ),
        (
            {"name": "x", "roles": [{"name": "a", "command": "b", "replicas": "4:2"}]},
            [("roles[0].replicas.min", "must be ≤ roles[0].replicas.max (got 4 > 2)")],
        ),
        (
            {"name": "x", "roles": [{"name": "a", "command": "b", "ends_job": False}]},
            [("roles", "no role ends the job: give one role ends_job: true")],
        ),
        (
            {"name": "x", "roles": []},
            [("roles", "List should have at least 1 item after validation, not 0")],
        ),
        (
            {
                "name": "x",
                "roles": [
                    {"name": "chief", "command": "c", "launcher": "ps", "replicas": 2},
                    {"name": "ps", "command": "c", "launcher": "ps"},
                    {"name": "worker", "command": "c", "launcher": "ps", "replicas": "1:4"},
                ],
            },
            [("roles[0].replicas", "a parameter-server job has exactly 1 chief (got 2)")],
        ),
        (
            {
                "name": "x",
                "roles": [
                    {"name": "worker", "command": "c", "launcher": "ps"},
                    {"name": "chief", "command": "c", "launcher": "ps"},
                ],
            },
            [
                (
                    "roles[1].launcher",
                    "a chief with launcher 'ps' observes the job's parameter servers: "
                    "the job needs a 'ps' role",
                )
            ],
        ),
    ],
)
def test_bad_roles_name_the_field(data: dict[str, object], expected: list[tuple[str, str]]) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    assert info.value.problems == expected


@pytest.mark.parametrize(
    ("role", "path", "message"),
    [
        (
            {"restart": "Sometimes"},
            "roles[0].restart.policy",
            "Input should be 'Never', 'OnFailure', 'Always' or 'ExitCode'",
        ),
        (
            {"launcher": "horovod"},
            "roles[0].launcher",
            "Input should be 'tidal', 'torchrun', 'tf', 'mpi' or 'ps'",
        ),
        (
            {"replicas": True},
            "roles[0].replicas",
            "expected a mapping (got true)",
        ),
        (
            {"resources": {"gpus": 65}},
            "roles[0].resources.gpus",
            "Input should be less than or equal to 64",
        ),
        (
            {"name": "Worker"},
            "roles[0].name",
            "must be 1-63 of a-z 0-9 _ . - starting with a letter or digit (got 'Worker')",
        ),
    ],
)
def test_bad_role_fields_name_their_path(role: dict[str, object], path: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"name": "x", "roles": [{"name": "w", "command": "a", **role}]})
    assert info.value.problems == [(path, message)]


def test_a_manifest_given_as_a_spec_still_says_command_is_required_in_field_order() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "spec": {}})
    assert [p for p, _ in info.value.problems] == ["name", "command", "apiVersion", "kind", "spec"]


def test_unsupported_names_each_role_and_what_it_lacks() -> None:
    problems = unsupported(job_from_spec(parse_spec_yaml(TF_SPEC)))
    assert problems == [
        (
            "roles.worker.replicas",
            "a 'tf' role has a fixed count (TF_CONFIG lists every replica): got 1:4",
        ),
    ]
    one = parse_spec({"name": "x", "roles": [{"name": "w", "command": "a", "replicas": "1:3"}]})
    assert unsupported(job_from_spec(one)) == []


def test_the_api_refuses_a_job_it_cannot_run_and_stores_nothing(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The backend says what it runs: one that runs one group per job refuses `ps`.
    monkeypatch.setattr(served.backend, "capabilities", ONE_GROUP, raising=False)
    spec = {"name": "x", "roles": [{"name": "ps", "command": "python ps.py", "launcher": "ps"}]}
    headers = {"Authorization": f"Bearer {served.token}"}
    for path in ("/jobs", "/jobs/validate"):
        response = httpx.post(f"{served.url}{path}", json=spec, headers=headers, timeout=5)
        body = response.json()
        problems = body["detail"] if path == "/jobs" else body["problems"]
        assert [(p["path"], p["msg"]) for p in problems] == [
            ("roles.ps.launcher", "the 'ps' launcher is not available on this server")
        ]
    assert served.store.list_jobs() == []
    with pytest.raises(InvalidRequest):
        served.client().submit(spec)
    assert served.store.list_jobs() == []
    # A single elastic tidal role given as `roles:` is today's job, and runs.
    ok = {"name": "y", "roles": [{"name": "worker", "command": "python t.py", "replicas": "1:2"}]}
    job = served.client().submit(ok)
    assert (job.min_slots, job.max_slots) == (1, 2)
    assert job.spec is not None and job.spec["roles"][0]["name"] == "worker"


def test_a_replica_of_several_gpus_holds_that_many_slots_of_one_host() -> None:
    job = job_from_spec(parse_spec_yaml(TF_SPEC.replace('replicas: "1:4"', 'replicas: "1:3"')))
    # chief 1 slot (gpus 1), two parameter servers 1 slot each (gpus 0), workers 2 each.
    assert job.gang_slots == (1, 1, 1)
    assert (job.slot_range.min, job.slot_range.max) == (3 + 2, 3 + 6)
    assert job.slots_for(2) == 7 and job.replicas_in(7) == 2 and job.replicas_in(8) == 2
    cluster = ClusterModel((ClusterHost("a", 4), ClusterHost("b", 2, labels={"x": "1"})))
    assert too_wide(job, cluster) == []
    narrow = ClusterModel((ClusterHost("a", 1), ClusterHost("b", 1)))
    assert too_wide(job, narrow) == [
        (
            "roles.worker.resources.gpus",
            "2 GPUs per replica, all on one host: the hosts this job may run on have at most "
            "1 slot(s)",
        )
    ]
    assert narrow.shortfall(None, {}, 2, replica=2) == (
        "one replica needs 2 slots on one host; the widest host that matches has 1"
    )

    # Only the hosts the job may run on count; when none matches yet, any host.
    def wide(gpus: int, labels: dict[str, str]) -> Job:
        spec = {"name": "x", "command": "a", "resources": {"gpus": gpus}}
        return job_from_spec(parse_spec({**spec, "target": {"labels": labels}}))

    labelled = wide(4, {"x": "1"})
    assert too_wide(wide(4, {}), cluster, named_roles=False) == []
    assert [p for p, _ in too_wide(labelled, cluster, named_roles=False)] == ["resources.gpus"]
    assert [p for p, _ in too_wide(labelled, narrow, named_roles=False)] == ["resources.gpus"]
    assert too_wide(wide(2, {"y": "1"}), cluster, named_roles=False) == []
