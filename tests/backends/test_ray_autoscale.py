"""``tidal server --backend ray --autoscale`` on a real local Ray cluster whose autoscaler
adds and removes nodes.

The cluster: a head of 4 ``tidal_slot`` and one node type of 4 slots (at most one such
node), on Ray's fake multi-node provider: the real autoscaler (Ray's monitor process) starts
and stops each node as processes on this machine. A job that wants 8 slots gets the
cluster grown and grows onto the new node; when it ends the request is withdrawn and the
idle node goes after Ray's idle timeout (3 s here).

Everything started here is stopped here: the head runs under ``ray start --block`` in a
session of its own and takes its processes with it when terminated; anything of this
cluster still alive afterwards (found by its temporary folder) is killed by process id.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.backends.test_ray import _digits, _running, _until, _workers_of
from tidal.client import Client
from tidal.wire.schema import EventView

pytest.importorskip("ray.autoscaler._private.fake_multi_node.node_provider")

ROOT = Path(__file__).resolve().parents[2]
SLOTS_PER_NODE = 4
#: Seconds a node stays idle before the autoscaler removes it.
IDLE_TIMEOUT = 3.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _autoscaling_config(gcs_address: str) -> dict[str, object]:
    """A head of 4 slots and at most one more node of 4 slots, added on demand."""
    node = {"CPU": 1, "tidal_slot": SLOTS_PER_NODE}
    return {
        "cluster_name": "tidal-autoscale-test",
        "max_workers": 1,
        "provider": {
            "type": "external",
            "module": "tests.backends.ray_fake_provider.DistinctIdProvider",
            "gcs_address": gcs_address,
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
        },
        "available_node_types": {
            "ray.head.default": {"resources": node, "node_config": {}, "max_workers": 0},
            "slots4": {
                "resources": node,
                "node_config": {},
                "min_workers": 0,
                "max_workers": 1,
            },
        },
        "head_node_type": "ray.head.default",
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": IDLE_TIMEOUT / 60,
        "auth": {},
        "docker": {},
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


@dataclass
class AutoscalingCluster:
    """The head's process, its address and the environment its users need."""

    head: subprocess.Popen[bytes]
    address: str
    env: dict[str, str]
    root: Path


def _processes_under(root: Path) -> list[int]:
    """Processes whose command line names ``root`` (this cluster's session folder)."""
    found = subprocess.run(["pgrep", "-f", str(root)], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split() if int(pid) != os.getpid()]


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AutoscalingCluster]:
    """The head (4 slots) with its autoscaler; stopped with every process it started."""
    # A short folder: Ray's socket paths under it must stay within 107 bytes.
    root = tmp_path_factory.mktemp("ras")
    for folder in (root / "tmp", root / "home"):
        folder.mkdir(parents=True)
    port = _free_port()
    address = f"127.0.0.1:{port}"
    config = root / "autoscaling.json"
    config.write_text(json.dumps(_autoscaling_config(address)))
    env = {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_TMPDIR": str(root / "tmp"),
        "HOME": str(root / "home"),
    }
    head_env = dict(
        os.environ,
        **env,
        # The fake provider runs only under this; the autoscaler looks every second.
        RAY_FAKE_CLUSTER="1",
        AUTOSCALER_UPDATE_INTERVAL_S="1",
        # The autoscaler's process imports the provider from this repository.
        PYTHONPATH=os.pathsep.join(
            [str(ROOT), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
        ),
    )
    ray_cli = str(Path(sys.executable).with_name("ray"))
    log = open(root / "head.log", "wb")  # noqa: SIM115
    head = subprocess.Popen(
        [
            ray_cli,
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=1",
            f"--resources={json.dumps({'tidal_slot': SLOTS_PER_NODE})}",
            f"--autoscaling-config={config}",
            "--include-dashboard=false",
            f"--ray-client-server-port={_free_port()}",
            "--dashboard-agent-listen-port=0",
            f"--temp-dir={root / 'tmp'}",
            "--disable-usage-stats",
        ],
        env=head_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:

        def listening() -> bool:
            assert head.poll() is None, (root / "head.log").read_text()[-3000:]
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        _until(listening, 90, "the Ray head")
        yield AutoscalingCluster(head, address, env, root)
    finally:
        head.send_signal(signal.SIGTERM)  # --block: the head stops every process it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=10)
        log.close()
        # Nodes the autoscaler started and had not removed yet are not the head's children.
        try:
            _until(lambda: not _processes_under(root), 20, "the cluster's processes to end")
        except AssertionError:
            for pid in _processes_under(root):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _until(lambda: not _processes_under(root), 20, "the cluster's processes to die")


@dataclass
class Server:
    process: subprocess.Popen[str]
    client: Client
    data: Path


@pytest.fixture
def server(cluster: AutoscalingCluster, tmp_path: Path) -> Iterator[Server]:
    """``tidal server --backend ray --autoscale --max-slots 8`` on the cluster."""
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
            cluster.address,
            "--autoscale",
            "--max-slots",
            "8",
            "--data-dir",
            str(data),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env=dict(os.environ, TIDAL_HOME=str(tmp_path / "home"), **cluster.env),
    )
    try:
        _until(lambda: (data / "server.json").exists() or process.poll() is not None, 90, "up")
        assert process.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
        with Client(data_dir=data, timeout=30) as client:
            yield Server(process, client, data)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        log.close()
        _until(lambda: not _workers_of(tmp_path), 30, "the workers to end")


def _requests(client: Client) -> list[EventView]:
    """What the server asked the cluster for, oldest first."""
    return sorted((e for e in client.events() if e.kind == "autoscale"), key=lambda e: e.id)


def _extra(client: Client) -> list[int]:
    """The slots beyond the cluster's of each request for more than nothing."""
    return [e.data["extra_slots"] for e in _requests(client) if e.data["wanted_slots"] > 0]


def test_a_job_wanting_8_slots_grows_the_cluster_and_the_node_goes_when_it_ends(
    server: Server, cluster: AutoscalingCluster, tmp_path: Path
) -> None:
    client = server.client
    assert client.cluster().total_slots == SLOTS_PER_NODE
    (head,) = [h.name for h in client.cluster().hosts]

    asked = time.monotonic()
    job = client.submit(_digits("grow", 400, tmp_path / "grow.json", "1:8")).id
    # The autoscaler starts a node for the 4 slots the job wants beyond the head's.
    _until(lambda: client.cluster().total_slots == 2 * SLOTS_PER_NODE, 120, "a new node")
    grown = time.monotonic() - asked
    (added,) = [h.name for h in client.cluster().hosts if h.name != head]
    # The job grows onto it at once (the backend finds the node, the policy hands it out).
    _until(lambda: len(_running(client, job)) == 8, 240, "the job on 8 workers")
    trained = time.monotonic() - asked
    assert {host for host, _ in _running(client, job)} == {head, added}
    assert _extra(client)[:1] == [4], _requests(client)

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
        f"\nnode joined {grown:.1f} s after the job asked; 8 workers running after "
        f"{trained:.1f} s; node released {released:.1f} s after the job ended "
        f"(idle timeout {IDLE_TIMEOUT:.0f} s)"
    )
