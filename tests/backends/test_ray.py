"""The Ray backend on a real local multi-node Ray cluster, driven through a real server.

One cluster for the module: a head node without slots and nodes of 4 ``tidal_slot`` each,
all on 127.0.0.1. Scenes: two jobs share two nodes fairly; a node dies mid-training and
both jobs go on with the remaining slots and finish correctly; a node joins and a job
grows onto it, and once cancelled its workers end on every node; multi-role jobs (a ``tf``
chief and workers over both nodes reach each other at their TF_CONFIG addresses; a ``ps``
job trains through its server). Then the backend conformance suite, on a backend in this
process joined to the same cluster.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.backends.conformance import BackendConformance, Harness
from tests.runtime.launcher import (
    SCRIPT,
    assert_each_sample_once,
    assert_ranks_agree,
    final_history,
    steps,
)
from tidal.client import Client

# Ray reads this when imported: keep every node on 127.0.0.1 (it would otherwise pick the
# machine's external address). Harmless for anything else in the session.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
cluster_utils = pytest.importorskip("ray.cluster_utils")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits_mlp.py"
TF_MESH = Path(__file__).resolve().parents[1] / "scripts" / "tf_mesh.py"
PS_DIGITS = Path(__file__).resolve().parents[2] / "examples" / "ps_digits.py"
SLOTS_PER_NODE = 4
DIGITS = 1797
# The loader leaves out an epoch's tail smaller than the world (1797 = 28 x 64 + 5 would
# lose 5 samples at 8 workers); with 60 the tail is 57, so every sample counts.
BATCH = 60

# Every scene is bounded: a wrong address makes Ray hang rather than fail.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@dataclass
class RayCluster:
    """The module's cluster and the environment its users need."""

    cluster: Any
    env: dict[str, str]

    @property
    def address(self) -> str:
        """What ``--ray-address`` takes."""
        return str(self.cluster.address)

    def add_node(self) -> Any:
        """A node of 4 slots; returns once it is registered."""
        # A CPU per slot: each worker's actor reserves its `resources.cpus` (1 by default).
        return self.cluster.add_node(
            num_cpus=SLOTS_PER_NODE, resources={"tidal_slot": SLOTS_PER_NODE}
        )

    def slot_nodes(self) -> list[Any]:
        """The live nodes that offer slots."""
        return list(self.cluster.worker_nodes)


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    """A head without slots and two nodes of 4 slots, on 127.0.0.1."""
    root = tmp_path_factory.mktemp("ray")
    env = {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_TMPDIR": str(root / "tmp"),
        # Ray writes an auth token under the home folder.
        "HOME": str(root / "home"),
    }
    for path in (root / "tmp", root / "home"):
        path.mkdir()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    cluster = cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            # A dead node is noticed in about a second instead of ~13 s.
            "_system_config": {
                "health_check_initial_delay_ms": 0,
                "health_check_period_ms": 250,
                "health_check_failure_threshold": 4,
            },
        },
    )
    made = RayCluster(cluster, env)
    try:
        for _ in range(2):
            made.add_node()
        cluster.wait_for_nodes()
        yield made
    finally:
        cluster.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@dataclass
class Server:
    """A ``tidal server --backend ray`` subprocess and a client on it."""

    process: subprocess.Popen[str]
    client: Client
    data: Path


@pytest.fixture
def server(ray_cluster: RayCluster, tmp_path: Path) -> Iterator[Server]:
    """The server on the module's cluster; stopped, with its actors, after the test."""
    with ray_server(ray_cluster.address, ray_cluster.env, tmp_path) as made:
        yield made


@contextmanager
def ray_server(
    address: str, env: Mapping[str, str], tmp_path: Path, *args: str
) -> Iterator[Server]:
    """``tidal server --backend ray [args]`` on the cluster at ``address`` (``env``: what
    its driver needs), with a client; stopped after, with every worker it started."""
    data = tmp_path / "data"
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidal.cli",
            "server",
            "--backend",
            "ray",
            "--ray-address",
            address,
            *args,
            "--data-dir",
            str(data),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env=dict(os.environ, TIDAL_HOME=str(tmp_path / "home"), **env),
    )
    try:
        _until(lambda: (data / "server.json").exists() or process.poll() is not None, 90, "up")
        assert process.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
        with Client(data_dir=data, timeout=30) as client:
            yield Server(process, client, data)
    finally:
        process.send_signal(signal.SIGINT)  # jobs released, actors killed, driver gone
        try:
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        log.close()
        _until(lambda: not _workers_of(tmp_path), 30, "the workers to end")


def _workers_of(tmp_path: Path) -> list[str]:
    """Worker processes whose command line names this test's folder."""
    found = subprocess.run(
        ["pgrep", "-f", f"(digits_mlp|elastic_digits).py .*{tmp_path}"],
        capture_output=True,
        text=True,
    )
    return found.stdout.split()


def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _running(client: Client, job: str) -> list[tuple[str, int]]:
    """The slots of the job's running workers."""
    return [(w.host, w.slot) for w in client.get(job).worker_list if w.state == "running"]


def _node_of(host: str, nodes: list[Any]) -> Any:
    """The cluster node behind a host name (``<address>-<node id prefix>``)."""
    prefix = host.rpartition("-")[2]
    return next(n for n in nodes if n.node_id.startswith(prefix))


def _digits(name: str, epochs: int, result: Path, workers: str) -> dict[str, object]:
    return {
        "name": name,
        "command": [
            "python",
            str(EXAMPLE),
            "--epochs",
            str(epochs),
            "--step-delay",
            "0.05",
            "--result",
            str(result),
        ],
        "workers": workers,
    }


def _audited(
    name: str, epochs: int, out: Path, workers: str, step_delay: float = 0.03
) -> dict[str, object]:
    """A job that records every committed step (world, samples, parameters) in ``out``."""
    out.mkdir(parents=True)
    return {
        "name": name,
        "command": [
            "python",
            str(SCRIPT),
            "--out",
            str(out),
            "--epochs",
            str(epochs),
            "--step-delay",
            str(step_delay),
            "--batch-size",
            str(BATCH),
        ],
        "workers": workers,
        # Losing a node fails each of its workers: one restart each.
        "restart": {"max_restarts": 8},
        "env": {"TIDAL_TIMEOUT": "5"},
    }


def _progress(out: Path) -> tuple[int, int]:
    """The latest step any worker of the job recorded, and the latest generation."""
    step = gen = 0
    for path in out.glob("steps-*.jsonl"):
        lines = path.read_text().splitlines()
        if lines and lines[-1].endswith("}"):
            record = json.loads(lines[-1])
            step, gen = max(step, int(record["step"])), max(gen, int(record["gen"]))
    return step, gen


def _check_audit(out: Path, epochs: int) -> dict[int, list[dict[str, Any]]]:
    history = final_history(steps(out))
    assert len(history) == epochs * -(-DIGITS // BATCH), sorted(history)[-5:]
    assert_each_sample_once(history, DIGITS)
    assert_ranks_agree(history)
    return history


def test_two_jobs_share_two_nodes_fairly(server: Server, ray_cluster: RayCluster) -> None:
    """8 slots on two nodes: job 1 takes all 8, job 2 (up to 4) arrives → 4 / 4, one
    node each; both train to the expected accuracy without a restart."""
    client, tmp = server.client, server.data.parent
    assert client.cluster().total_slots == 2 * SLOTS_PER_NODE

    job1 = client.submit(_digits("job1", 24, tmp / "job1.json", "1:8")).id
    # Eight workers importing torch on a loaded 2-core machine took 99 s in one run.
    _until(lambda: len(_running(client, job1)) == 8, 240, "job 1 on 8 workers")
    assert len({host for host, _ in _running(client, job1)}) == 2, "job 1 spans both nodes"

    job2 = client.submit(_digits("job2", 8, tmp / "job2.json", "1:4")).id
    # The split is the controller's decision; under load job 1 may finish before job 2's
    # workers have started, so the split is read from the allocation timeline.
    split: dict[str, set[str]] = {}

    def shared() -> bool:
        held: dict[str, list[tuple[str, int]]] = {}
        for point in sorted(client.allocations(), key=lambda a: a.time):
            held[point.job_id] = point.slots
            if len(held.get(job1, ())) == 4 and len(held.get(job2, ())) == 4:
                split.update({j: {h for h, _ in held[j]} for j in (job1, job2)})
                return True
        return False

    _until(shared, 120, "4 / 4")
    assert split[job1].isdisjoint(split[job2]) and len(split[job2]) == 1, split
    assert client.wait(job2, timeout=180).state == "succeeded"
    job2_workers = client.get(job2).worker_list
    assert {(w.host, w.slot) for w in job2_workers} == {
        (host, slot) for host in split[job2] for slot in range(SLOTS_PER_NODE)
    }
    assert client.wait(job1, timeout=180).state == "succeeded"
    for job, name in ((job1, "job1"), (job2, "job2")):
        assert client.get(job).restarts == 0, [(e.kind, e.message) for e in client.events(job)]
        result = json.loads((tmp / f"{name}.json").read_text())
        assert result["accuracy"] > 0.95, result
        assert client.logs(job, tail=100), "worker output reached the controller's log dir"
        # What the workers logged with tidal.log_metrics came back through the actors.
        losses = [m.values["loss"] for m in client.metrics(job) if "loss" in m.values]
        assert losses and losses[-1] < losses[0], losses


def test_node_lost_mid_training(server: Server, ray_cluster: RayCluster) -> None:
    """Job A (up to 6) spans both nodes, job B (2) shares the second. The node where only
    A runs dies: A goes on with its survivors, B is untouched, and both finish with
    every sample seen once per epoch."""
    client, tmp = server.client, server.data.parent
    epochs = 16
    # Fair share of 8 slots, B capped at 2: A gets 6, so A spans both nodes.
    job_a = client.submit(_audited("a", epochs, tmp / "a", "2:6")).id
    job_b = client.submit(_audited("b", epochs, tmp / "b", "1:2")).id
    _until(
        lambda: len(_running(client, job_a)) == 6 and len(_running(client, job_b)) == 2,
        120,
        "A on 6 workers and B on 2",
    )
    hosts_b = {host for host, _ in _running(client, job_b)}
    hosts_a = {host for host, _ in _running(client, job_a)}
    assert len(hosts_a) == 2 and len(hosts_b) == 1, (hosts_a, hosts_b)
    (doomed,) = hosts_a - hosts_b
    _until(lambda: _progress(tmp / "a")[0] >= 60, 60, "A to train a while on 6 workers")
    step, gen = _progress(tmp / "a")
    assert step < epochs * 25, "job A nearly finished before the scene"

    node = _node_of(doomed, ray_cluster.slot_nodes())
    lost_at = time.monotonic()
    ray_cluster.cluster.remove_node(node, allow_graceful=False)
    # Progress regained: a step trained in a generation formed after the loss.
    _until(lambda: _progress(tmp / "a")[1] > gen, 120, "A to train in a new generation")
    regained = time.monotonic() - lost_at
    _until(lambda: client.cluster().total_slots == SLOTS_PER_NODE, 30, "the node's slots gone")
    print(
        f"\nnode lost at step {step} of job A → A trains again (2 survivors) "
        f"{regained:.1f} s later; the node's slots left the cluster within "
        f"{time.monotonic() - lost_at:.1f} s"
    )

    assert client.wait(job_a, timeout=180).state == "succeeded"
    assert client.wait(job_b, timeout=180).state == "succeeded"
    history = _check_audit(tmp / "a", epochs)
    worlds = {r["world"] for group in history.values() for r in group}
    # When it fails, what happened to A says why (its events: restarts, requeues).
    assert worlds >= {6, 2}, [(e.kind, e.message) for e in client.events(job_a)]
    _check_audit(tmp / "b", epochs)
    assert client.get(job_b).restarts == 0
    kinds = [e.kind for e in client.events(job_a)]
    assert "worker_failed" in kinds, kinds


def test_job_grows_onto_a_new_node_then_is_cancelled(
    server: Server, ray_cluster: RayCluster
) -> None:
    """A job that wants 8 runs on the one node there is; a node joins: it grows onto it.
    Cancelled, it checkpoints and its workers end on both nodes."""
    client, tmp = server.client, server.data.parent
    while len(ray_cluster.slot_nodes()) > 1:
        ray_cluster.cluster.remove_node(ray_cluster.slot_nodes()[-1])
    _until(lambda: client.cluster().total_slots == SLOTS_PER_NODE, 30, "one node")

    # Long enough to outlast the growth on a busy machine: it is cancelled anyway.
    job = client.submit(_audited("grow", 100, tmp / "grow", "1:8")).id
    _until(lambda: len(_running(client, job)) == SLOTS_PER_NODE, 120, "4 workers")
    old = {host for host, _ in _running(client, job)}

    joined_at = time.monotonic()
    ray_cluster.add_node()
    _until(lambda: len(_running(client, job)) == 2 * SLOTS_PER_NODE, 120, "8 workers")
    print(f"\nnode joined → job on 8 workers in {time.monotonic() - joined_at:.1f} s")
    assert len({host for host, _ in _running(client, job)} - old) == 1
    _until(lambda: _world(tmp / "grow") == 8, 60, "a step on 8 workers")

    client.cancel(job)
    _until(lambda: client.get(job).state == "cancelled", 30, "the job cancelled")
    _until(lambda: not _workers_of(tmp), 60, "the job's workers to end")
    checkpoints = server.data / "jobs" / job / "checkpoints"
    assert list(checkpoints.glob("checkpoint-*.pt")), "released workers checkpoint first"
    history = final_history(steps(tmp / "grow"))
    assert_ranks_agree(history)
    # Newcomers are admitted as each is ready: 4, then up to 8, never down.
    worlds = [group[0]["world"] for group in history.values()]
    assert worlds[0] == 4 and worlds[-1] == 8 and worlds == sorted(worlds), set(worlds)
    assert client.get(job).restarts == 0


def _world(out: Path) -> int:
    """The world of the latest step recorded."""
    latest: dict[str, Any] = {"step": 0, "world": 0}
    for path in out.glob("steps-*.jsonl"):
        lines = path.read_text().splitlines()
        if lines and lines[-1].endswith("}"):
            record = json.loads(lines[-1])
            if record["step"] > latest["step"]:
                latest = record
    return int(latest["world"])


def test_a_tf_job_of_several_roles_reaches_every_replica(server: Server) -> None:
    """A chief and four workers, ``launcher: tf``, over both nodes: each replica listens
    at its TF_CONFIG address (its node's address, a port free there) and reaches every
    other one. The job succeeds with the chief, and its workers are stopped."""
    client, tmp = server.client, server.data.parent
    out = tmp / "mesh"

    def role(name: str, replicas: int) -> dict[str, object]:
        command = ["python", str(TF_MESH), str(out)]
        return {"name": name, "command": command, "replicas": replicas, "launcher": "tf"}

    job = client.submit({"name": "mesh", "roles": [role("chief", 1), role("worker", 4)]}).id
    state = client.wait(job, timeout=90).state
    assert state == "succeeded", (state, [(e.kind, e.message) for e in client.events(job)])

    reports = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert set(reports) == {"chief-0", *(f"worker-{i}" for i in range(4))}, sorted(reports)
    cluster = reports["chief-0"]["cluster"]
    assert sorted(cluster) == ["chief", "worker"] and len(cluster["worker"]) == 4, cluster
    names = {
        f"{r}-{i}": address
        for r, addresses in cluster.items()
        for i, address in enumerate(addresses)
    }
    assert len(set(names.values())) == 5, names
    for name, report in reports.items():
        assert report["cluster"] == cluster and report["me"] == names[name], report
        others = {address: other for other, address in names.items() if other != name}
        assert report["reached"] == others, (name, report["reached"])

    workers = client.get(job).worker_list
    for w in workers:
        # Each replica listened on its own node's address.
        assert w.index is not None and names[f"{w.role}-{w.index}"].startswith(
            f"{w.ip_address}:"
        ), (w, names)
    assert len({w.host for w in workers}) == 2, "the replicas span both nodes"
    states = sorted((w.role, w.state) for w in workers)
    assert states == [("chief", "exited"), *[("worker", "released")] * 4], states
    _until(lambda: not _replicas(f"tf_mesh.py {out}"), 30, "the replicas to end")


def test_a_parameter_server_job_trains_and_its_server_stops(server: Server) -> None:
    """A ``ps`` job (one server, two workers): the server binds its node's address and
    publishes it in the job's folder, the workers train digits through it, and the job
    succeeds once they finished; the server is then stopped."""
    client, tmp = server.client, server.data.parent
    out = tmp / "ps-out"
    command = ["python", str(PS_DIGITS), "--out", str(out), "--epochs", "2"]
    roles = [
        {"name": "ps", "command": command, "replicas": 1, "launcher": "ps"},
        {"name": "worker", "command": command, "replicas": 2, "launcher": "ps"},
    ]
    env = {"TIDAL_PS_MODE": "async", "TIDAL_PS_PEER_TIMEOUT": "5"}
    job = client.submit({"name": "ps", "env": env, "roles": roles}).id
    state = client.wait(job, timeout=120).state
    assert state == "succeeded", (state, [(e.kind, e.message) for e in client.events(job)])

    results = [json.loads(p.read_text()) for p in sorted(out.glob("worker-*.json"))]
    assert [r["worker"] for r in results] == ["worker-0", "worker-1"], results
    assert all(r["accuracy"] >= 0.85 for r in results), results
    detail = client.get(job)
    (server_ip,) = {w.ip_address for w in detail.worker_list if w.role == "ps"}
    published = (server.data / "jobs" / job / "ps-addresses" / "ps-0.addr").read_text()
    assert published.startswith(f"tcp://{server_ip}:"), published
    assert [(r.name, r.active, r.failed) for r in detail.roles] == [("ps", 0, 0), ("worker", 0, 0)]
    assert {w.state for w in detail.worker_list} <= {"exited", "released"}, detail.worker_list
    _until(lambda: not _replicas(f"ps_digits.py --out {out}"), 30, "the replicas to end")


def _replicas(pattern: str) -> list[str]:
    """Processes whose command line matches ``pattern`` (a test's own folder is in it)."""
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return found.stdout.split()


class TestRayConformance(BackendConformance):
    """The backend conformance suite on the module's cluster (re-attaching is not
    supported: a job's actors belong to the controller's Ray driver and end with it)."""

    @pytest.fixture
    def harness(self, ray_cluster: RayCluster) -> Iterator[Harness]:
        """The Ray backend, joined to the cluster from this process; closing it stops its
        jobs and leaves the cluster. Made once per test (it cannot re-attach)."""
        from tidal.backends.ray import RayBackend

        backend = RayBackend(ray_address=ray_cluster.address, store_host="127.0.0.1")
        slots = [(h.name, i) for h in backend.hosts() for i in range(h.slots)]
        handed: list[RayBackend] = []

        def make(data: Path) -> RayBackend:
            assert not handed, "one Ray backend per test"
            handed.append(backend)
            return backend

        made = Harness(
            make=make,
            slots=(slots[0], slots[1], slots[-1]),
            wide=(slots[0], slots[1], slots[2], slots[3]),
            reattach_unsupported="the Ray backend's jobs end with the controller (its actors "
            "belong to the controller's Ray driver)",
        )
        try:
            yield made
        finally:
            made.close()
            if not handed:
                backend.close()
