"""``tidal server --backend ray --autoscale`` on a real local Ray cluster whose autoscaler
adds and removes nodes.

The cluster: a head of 4 ``tidal_slot`` and one node type of 4 slots (at most one such
node), on Ray's fake multi-node provider: the real autoscaler (Ray's monitor process) starts
and stops each node as processes on this machine. A job that wants 8 slots gets the
cluster grown and starts growing onto the new node; a second job of the same priority
arrives meanwhile and gets its fair share of the grown cluster, the first shrinking in
place to make room, and the request counts both jobs' wants; once the second ends the
first grows to 8; when it ends the request is withdrawn and the idle node goes after
Ray's idle timeout (3 s here).

The cluster (and how every process of it is stopped): ``tests/backends/ray_autoscaling.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends.test_ray import Server, _digits, _running, _until, ray_server
from tidal.client import Client
from tidal.wire.schema import EventView

pytest.importorskip("ray.autoscaler._private.fake_multi_node.node_provider")
from tests.backends.ray_autoscaling import (
    IDLE_TIMEOUT,
    SLOTS_PER_NODE,
    AutoscalingCluster,
    autoscaling_cluster,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AutoscalingCluster]:
    """The head (4 slots) with its autoscaler; stopped with every process it started."""
    with autoscaling_cluster(tmp_path_factory.mktemp("ras")) as made:
        yield made


@pytest.fixture
def server(cluster: AutoscalingCluster, tmp_path: Path) -> Iterator[Server]:
    """``tidal server --backend ray --autoscale --max-slots 12`` on the cluster (which
    cannot grow past 8: the request says what the jobs would use, not what Ray can give)."""
    args = ("--autoscale", "--max-slots", "12")
    with ray_server(cluster.address, cluster.env, tmp_path, *args) as made:
        yield made


def _requests(client: Client) -> list[EventView]:
    """What the server asked the cluster for, oldest first."""
    return sorted((e for e in client.events() if e.kind == "autoscale"), key=lambda e: e.id)


def _extra(client: Client) -> list[int]:
    """The slots beyond the cluster's of each request for more than nothing."""
    return [e.data["extra_slots"] for e in _requests(client) if e.data["wanted_slots"] > 0]


def _pids(client: Client, job: str) -> dict[tuple[str, int], int | None]:
    """The process of each running worker of the job, by its slot."""
    return {(w.host, w.slot): w.pid for w in client.get(job).worker_list if w.state == "running"}


def test_a_job_wanting_8_slots_grows_the_cluster_and_shares_it_with_a_second_job(
    server: Server, cluster: AutoscalingCluster, tmp_path: Path
) -> None:
    client = server.client
    assert client.cluster().total_slots == SLOTS_PER_NODE
    (head,) = [h.name for h in client.cluster().hosts]

    asked = time.monotonic()
    job = client.submit(_digits("grow", 400, tmp_path / "grow.json", "1:8")).id
    # The autoscaler starts a node for the 4 slots the job wants beyond the head's.
    _until(lambda: client.cluster().total_slots == 2 * SLOTS_PER_NODE, 180, "a new node")
    grown = time.monotonic() - asked
    (added,) = [h.name for h in client.cluster().hosts if h.name != head]
    assert _extra(client)[:1] == [4], _requests(client)

    # While the job grows onto the node, a second job of the same priority arrives: the
    # fair share of 8 slots between them is 4 each, and the first shrinks in place.
    _until(lambda: added in {h for h, _ in client.get(job).slots}, 60, "the job given the node")
    before = _pids(client, job)
    other = client.submit(_digits("other", 400, tmp_path / "other.json", "1:4")).id
    _until(
        lambda: len(_running(client, other)) == 4 and len(_running(client, job)) == 4,
        300,
        "4 workers of each job",
    )
    shared = time.monotonic() - asked
    first = client.get(job)
    assert first.restarts == 0 and first.state in ("running", "rescaling"), first
    kept = _pids(client, job)
    # Every worker the first job had on a slot it kept is still the same process.
    assert all(kept[slot] == pid for slot, pid in before.items() if slot in kept), (
        before,
        kept,
    )
    assert not any(w.state == "failed" for w in first.worker_list), first.worker_list
    assert not {s for s in kept} & {s for s in _pids(client, other)}
    # The request counts both: the first job's 8 and the second's 4 once it runs.
    _until(
        lambda: any(e.data["by_job"] == {job: 8, other: 4} for e in _requests(client)),
        30,
        "a request for both jobs",
    )
    both = next(e for e in _requests(client) if e.data["by_job"] == {job: 8, other: 4})
    assert both.data["wanted_slots"] == 12, both
    assert both.data["bundles"] == [{"slots": 1, "labels": {}, "count": 12}], both

    # The second job ends: the first grows onto the whole grown cluster.
    client.cancel(other)
    assert client.wait(other, timeout=120).state == "cancelled"
    _until(lambda: len(_running(client, job)) == 8, 300, "the job on 8 workers")
    trained = time.monotonic() - asked
    assert {host for host, _ in _running(client, job)} == {head, added}
    assert client.get(job).restarts == 0

    # The job ends: the request is withdrawn and the idle node goes.
    client.cancel(job)
    assert client.wait(job, timeout=120).state == "cancelled"
    ended = time.monotonic()
    _until(lambda: client.cluster().total_slots == SLOTS_PER_NODE, 120, "the node released")
    released = time.monotonic() - ended
    assert [h.name for h in client.cluster().hosts] == [head]
    asked_for = [e.data["wanted_slots"] for e in _requests(client)]
    assert asked_for[-2:] == [8, 0], asked_for
    print(
        f"\nnode joined {grown:.1f} s after the job asked; 4 workers of each job after "
        f"{shared:.1f} s; 8 workers of the first after {trained:.1f} s; node released "
        f"{released:.1f} s after the job ended (idle timeout {IDLE_TIMEOUT:.0f} s)"
    )
