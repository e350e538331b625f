"""A multi-role job as the policy sees it, what it is launched with, and what refuses it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.controller.fakes import PS_JOB
from tidal.backends.base import LOCAL, ONE_GROUP, DiscoveredHost
from tidal.controller.cluster import ClusterModel
from tidal.controller.loop.allocation import allocation_problems, policy_request
from tidal.controller.loop.launching import JobFiles, build_launch
from tidal.controller.store.jobs import JobStore
from tidal.controller.support import unsupported
from tidal.model import job_from_spec
from tidal.spec import parse_spec, parse_spec_yaml


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    s = JobStore.open(tmp_path)
    yield s
    s.close()


def test_the_policy_sees_fixed_roles_plus_the_elastic_range(store: JobStore) -> None:
    record = store.add_job(parse_spec_yaml(PS_JOB), now=1.0)
    job = record.job
    request = policy_request(record, job, now=2.0)
    assert (request.min_slots, request.max_slots) == (3, 5)
    assert (record.min_slots, record.max_slots) == (3, 5)
    cluster = ClusterModel.single(8, name="h")
    assert (
        allocation_problems({record.id: [("h", i) for i in range(4)]}, {record.id: job}, cluster)
        == []
    )
    assert allocation_problems({record.id: [("h", 0), ("h", 1)]}, {record.id: job}, cluster) == [
        f"{record.id}: 2 slot(s) outside [3, 5]"
    ]


def test_a_fixed_multi_role_job_asks_for_exactly_its_sum(store: JobStore) -> None:
    spec = parse_spec(
        {
            "name": "tf",
            "roles": [
                {"name": "chief", "command": "a", "launcher": "tf"},
                {"name": "worker", "command": "a", "launcher": "tf", "replicas": 2},
            ],
        }
    )
    record = store.add_job(spec, now=1.0)
    request = policy_request(record, record.job, now=2.0)
    assert (request.min_slots, request.max_slots, request.target_slots) == (3, 3, None)
    # Kubeflow's default successPolicy: the chief ends the job.
    assert [r.ends_job for r in record.job.roles] == [True, False]


def test_a_one_role_job_asks_as_before(store: JobStore) -> None:
    record = store.add_job(parse_spec({"name": "a", "command": "x", "workers": "2:6"}), now=1.0)
    request = policy_request(record, record.job, now=2.0)
    assert (request.min_slots, request.max_slots) == (2, 6)


def test_the_launch_carries_every_role(tmp_path: Path) -> None:
    job = job_from_spec(parse_spec_yaml(PS_JOB), job_id="j1")
    launch = build_launch(job, JobFiles(tmp_path), gpu=False)
    assert [(r.name, r.launcher, r.min, r.max) for r in launch.roles] == [
        ("ps", "ps", 2, 2),
        ("worker", "ps", 1, 3),
    ]
    # The workers end the job (Kubeflow's default without a chief), the servers do not.
    assert [r.ends_job for r in launch.roles] == [False, True]
    one = job_from_spec(parse_spec({"name": "a", "command": "x"}), job_id="j2")
    assert build_launch(one, JobFiles(tmp_path), gpu=False).roles == ()


def test_what_each_backend_refuses() -> None:
    job = job_from_spec(parse_spec_yaml(PS_JOB))
    assert unsupported(job, capabilities=LOCAL) == []
    one_group = unsupported(job, capabilities=ONE_GROUP)
    assert one_group[0] == (
        "roles",
        "a job with several roles (ps, worker) is not available on this server",
    )
    assert ("roles.ps.launcher", "the 'ps' launcher is not available on this server") in one_group
    elastic_tf = parse_spec(
        {
            "name": "t",
            "roles": [{"name": "worker", "command": "a", "launcher": "tf", "replicas": "1:3"}],
        }
    )
    assert [p for p, _ in unsupported(job_from_spec(elastic_tf))] == ["roles.worker.replicas"]
    always = parse_spec(
        {"name": "t", "roles": [{"name": "worker", "command": "a", "restart": "Always"}]}
    )
    assert [p for p, _ in unsupported(job_from_spec(always))] == ["roles.worker.restart.policy"]
    two = parse_spec(
        {
            "name": "t",
            "roles": [
                {"name": "a", "command": "a"},
                {"name": "b", "command": "b", "launcher": "torchrun"},
            ],
        }
    )
    assert [p for p, _ in unsupported(job_from_spec(two))] == ["roles"]


def test_workers_of_several_gpus_are_asked_and_checked_as_whole_replicas(store: JobStore) -> None:
    spec = parse_spec(
        {
            "name": "wide",
            "roles": [
                {"name": "chief", "command": "a", "launcher": "tf", "resources": {"gpus": 2}},
                {"name": "ps", "command": "a", "launcher": "ps", "resources": {"gpus": 0}},
                {"name": "worker", "command": "a", "replicas": "1:3", "resources": {"gpus": 2}},
            ],
        }
    )
    record = store.add_job(spec, now=1.0)
    request = policy_request(record, record.job, now=2.0)
    assert (request.replica_slots, request.gang_slots) == (2, (2, 1))
    assert (request.min_slots, request.max_slots) == (5, 9)
    launch = build_launch(record.job, JobFiles(Path("/data")), gpu=True)
    assert [(r.name, r.replica_slots) for r in launch.roles] == [
        ("chief", 2),
        ("ps", 1),
        ("worker", 2),
    ]
    cluster = ClusterModel.from_hosts([DiscoveredHost(h, 4) for h in "abc"])
    jobs = {record.id: record.job}
    whole = [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]
    assert allocation_problems({record.id: whole}, jobs, cluster) == []
    # Five slots, but however the chief and ps are put, the worker's two are on two hosts.
    split = [("a", 0), ("b", 0), ("c", 0), ("c", 1), ("c", 2)]
    assert allocation_problems({record.id: split}, jobs, cluster) == [
        f"{record.id}: slots that do not make whole replicas on one host each"
    ]
