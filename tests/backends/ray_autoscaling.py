"""A real local Ray cluster whose autoscaler adds and removes nodes, for tests and
benchmarks of ``tidal server --autoscale``.

The head offers 4 ``tidal_slot`` and there is one node type of 4 slots (at most one such
node), on Ray's fake multi-node provider: the real autoscaler (the head's monitor process)
starts and stops each node as processes on this machine, from what is asked of it.

Everything started here is stopped here: the head runs under ``ray start --block`` in a
session of its own and takes its processes with it when terminated; anything of this
cluster still alive afterwards (found by its folder, which every one of its command lines
names) is killed by process id.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# Ray reads this when imported: a driver on this machine joins the cluster at 127.0.0.1
# (it would otherwise pick the machine's external address, where no node of it runs).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from ray.autoscaler._private.fake_multi_node.node_provider import (
    FakeMultiNodeProvider,
)

ROOT = Path(__file__).resolve().parents[2]
SLOTS_PER_NODE = 4
#: Seconds a node stays idle before the autoscaler removes it.
IDLE_TIMEOUT = 3.0


class DistinctIdProvider(FakeMultiNodeProvider):
    """Ray's fake provider, its node ids random (28 bytes, as real ones are).

    Ray's own numbers its nodes ``ffff…f00001``, ``ffff…f00002``: every id would start
    with the same 8 characters, which is how tidal names hosts. Loaded by the autoscaler's
    process as an ``external`` provider.
    """

    def _next_hex_node_id(self) -> str:
        return secrets.token_hex(28)


@dataclass
class AutoscalingCluster:
    """The head's process, its address and the environment its users need."""

    head: subprocess.Popen[bytes]
    address: str
    env: dict[str, str]
    root: Path


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``check`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def autoscaling_config(gcs_address: str) -> dict[str, object]:
    """A head of 4 slots and at most one more node of 4 slots, added on demand."""
    node = {"CPU": 1, "tidal_slot": SLOTS_PER_NODE}
    return {
        "cluster_name": "tidal-autoscale",
        "max_workers": 1,
        "provider": {
            "type": "external",
            "module": "tests.backends.ray_autoscaling.DistinctIdProvider",
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


def processes_under(root: Path) -> list[int]:
    """Processes whose command line names ``root`` (the cluster's session folder)."""
    found = subprocess.run(["pgrep", "-f", str(root)], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split() if int(pid) != os.getpid()]


@contextlib.contextmanager
def autoscaling_cluster(root: Path) -> Iterator[AutoscalingCluster]:
    """The head (4 slots) with its autoscaler, its files under ``root`` (keep it short:
    Ray's socket paths under it must stay within 107 bytes); stopped, with every process
    it started, on leaving."""
    for folder in (root / "tmp", root / "home"):
        folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    address = f"127.0.0.1:{port}"
    config = root / "autoscaling.json"
    config.write_text(json.dumps(autoscaling_config(address)))
    env = {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_TMPDIR": str(root / "tmp"),
        "HOME": str(root / "home"),
    }
    path = [str(ROOT), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    head_env = dict(
        os.environ,
        **env,
        # The fake provider runs only under this; the autoscaler looks every second.
        RAY_FAKE_CLUSTER="1",
        AUTOSCALER_UPDATE_INTERVAL_S="1",
        # The autoscaler's process imports the provider from this repository.
        PYTHONPATH=os.pathsep.join(filter(None, path)),
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
            f"--ray-client-server-port={free_port()}",
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

        def started() -> bool:
            # What `ray start` prints once every process of the head is up (the GCS port
            # alone answers before the head's raylet takes drivers).
            text = (root / "head.log").read_text(errors="replace")
            if head.poll() is not None:
                raise RuntimeError(text[-3000:])
            return "Ray runtime started" in text

        wait_until(started, 90, "the Ray head")
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
            wait_until(lambda: not processes_under(root), 20, "the cluster's processes to end")
        except TimeoutError:
            for pid in processes_under(root):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not processes_under(root), 20, "the cluster's processes to die")
