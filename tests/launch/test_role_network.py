"""Where a multi-role job's replicas are reached: ``TF_CONFIG`` addresses and ``mpi``
hostfiles follow the slot network the backend gives (the Ray backend's nodes), and stay
``127.0.0.1`` / host names without one (the local backend)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tidal.launch.api import RoleLaunch
from tidal.launch.groups.api import Outcome
from tidal.launch.groups.roles import RoleGroups
from tidal.launch.worker import WorkerSpec

#: Prints its TF_CONFIG, then stays up until stopped.
PRINT_TF_CONFIG = (
    "import os, time\nprint('TF_CONFIG=' + os.environ['TF_CONFIG'], flush=True)\ntime.sleep(60)\n"
)
ARGV = (sys.executable, "-c", PRINT_TF_CONFIG)


class NodeNetwork:
    """Slots on hosts ``n1``, ``n2``, ``n3`` at 10.0.0.1-3; ports counted from 7000 and
    every request recorded."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []
        self._next = 7000

    def address(self, slot: str) -> str:
        return "10.0.0." + slot.partition(":")[0].removeprefix("n")

    def free_ports(self, slots: Sequence[str]) -> list[int]:
        self.asked.append(list(slots))
        ports = list(range(self._next, self._next + len(slots)))
        self._next += len(slots)
        return ports


def _tf_job(tmp_path: Path, network: NodeNetwork | None) -> RoleGroups:
    roles = [
        RoleLaunch("chief", ARGV, launcher="tf"),
        RoleLaunch("worker", ARGV, launcher="tf", min=2, max=2, ends_job=False),
    ]
    spec = WorkerSpec(argv=[], job_id="net", log_dir=tmp_path / "logs")
    return RoleGroups(spec, roles, network=network, work_dir=tmp_path / "job")


def _poll_until_printed(groups: RoleGroups, tmp_path: Path, count: int) -> None:
    """Drive the job until ``count`` replicas printed their TF_CONFIG."""
    deadline = time.monotonic() + 30
    while len(_printed(tmp_path)) < count:
        groups.poll()
        assert time.monotonic() < deadline, f"{len(_printed(tmp_path))} of {count} printed"
        time.sleep(0.05)


def _printed(tmp_path: Path) -> list[dict[str, object]]:
    """Every TF_CONFIG the replicas printed, oldest worker first."""
    found: list[dict[str, object]] = []
    logs = sorted((tmp_path / "logs").glob("worker-*.log"), key=lambda p: int(p.stem[7:]))
    for log in logs:
        for line in log.read_text().splitlines():
            if line.startswith("TF_CONFIG="):
                found.append(json.loads(line.removeprefix("TF_CONFIG=")))
    return found


def _configs(tmp_path: Path) -> dict[tuple[str, int], dict[str, object]]:
    """Each replica's TF_CONFIG by (type, index); a replacement's overrides its
    predecessor's."""
    out: dict[tuple[str, int], dict[str, object]] = {}
    for config in _printed(tmp_path):
        task = config["task"]
        assert isinstance(task, dict)
        out[(str(task["type"]), int(task["index"]))] = config
    return out


def test_tf_addresses_are_each_slots_host_and_a_port_asked_of_it(tmp_path: Path) -> None:
    network = NodeNetwork()
    groups = _tf_job(tmp_path, network)
    try:
        assert network.asked == [], "nothing is asked before the slots are known"
        groups.assign(["n1:0", "n1:1", "n2:0"])
        assert network.asked == [["n1:0", "n1:1", "n2:0"]], "one batch for every replica"
        _poll_until_printed(groups, tmp_path, 3)
        configs = _configs(tmp_path)
        cluster = {"chief": ["10.0.0.1:7000"], "worker": ["10.0.0.1:7001", "10.0.0.2:7002"]}
        assert set(configs) == {("chief", 0), ("worker", 0), ("worker", 1)}
        assert all(c["cluster"] == cluster for c in configs.values()), configs

        # worker 1's host is gone: its replacement on n3 gets an address there; the
        # replicas that stayed keep theirs, and the same slots again ask nothing.
        groups.assign(["n1:0", "n1:1", "n3:0"])
        assert network.asked[1:] == [["n3:0"]]
        _poll_until_printed(groups, tmp_path, 4)
        moved = _configs(tmp_path)[("worker", 1)]
        assert moved["cluster"] == {
            "chief": ["10.0.0.1:7000"],
            "worker": ["10.0.0.1:7001", "10.0.0.3:7003"],
        }
        groups.assign(["n1:0", "n1:1", "n3:0"])
        assert len(network.asked) == 2
    finally:
        groups.stop(grace=5)
    assert groups.outcome is Outcome.STOPPED
    assert not [w for w in groups.workers.values() if w.process.poll() is None]


def test_without_a_network_tf_replicas_are_on_the_loopback(tmp_path: Path) -> None:
    groups = _tf_job(tmp_path, None)
    try:
        groups.assign(["h:0", "h:1", "h:2"])
        _poll_until_printed(groups, tmp_path, 3)
        configs = _configs(tmp_path)
        cluster = configs[("chief", 0)]["cluster"]
        assert isinstance(cluster, dict)
        addresses = [a for role in ("chief", "worker") for a in cluster[role]]
        assert len(addresses) == 3 and len(set(addresses)) == 3, addresses
        assert all(a.startswith("127.0.0.1:") and int(a.split(":")[1]) > 0 for a in addresses)
        assert all(c["cluster"] == cluster for c in configs.values())
    finally:
        groups.stop(grace=5)


def _mpi_job(tmp_path: Path, network: NodeNetwork | None) -> RoleGroups:
    roles = [
        RoleLaunch("launcher", ("true",), launcher="mpi"),
        RoleLaunch("worker", ("true",), launcher="mpi", min=3, max=3, ends_job=False),
    ]
    spec = WorkerSpec(argv=[], job_id="mpi", log_dir=tmp_path / "logs")
    return RoleGroups(spec, roles, network=network, work_dir=tmp_path / "job")


def test_mpi_hostfile_names_the_nodes_by_address(tmp_path: Path) -> None:
    slots = ["n1:0", "n1:1", "n2:0", "n2:1"]
    _mpi_job(tmp_path / "a", NodeNetwork()).assign(slots)
    hostfile = tmp_path / "a" / "job" / "hostfile-launcher"
    assert hostfile.read_text() == "10.0.0.1 slots=1\n10.0.0.2 slots=2\n"
    # Without a network (one machine), the slots' host names, as before.
    _mpi_job(tmp_path / "b", None).assign(slots)
    hostfile = tmp_path / "b" / "job" / "hostfile-launcher"
    assert hostfile.read_text() == "n1 slots=1\nn2 slots=2\n"


PRINT_PS_BIND = (
    "import os, time\n"
    "print('BIND=' + os.environ['TIDAL_PS_ROLE'] + ' ' + os.environ.get('TIDAL_PS_BIND', '-'),"
    " flush=True)\n"
    "time.sleep(60)\n"
)


def _binds(tmp_path: Path, groups: RoleGroups) -> dict[str, str]:
    """What each replica of a ps job printed: its role, and the bind it was given."""
    found: dict[str, str] = {}
    deadline = time.monotonic() + 30
    while len(found) < 2:
        groups.poll()
        assert time.monotonic() < deadline, found
        for log in (tmp_path / "logs").glob("worker-*.log"):
            for line in log.read_text().splitlines():
                if line.startswith("BIND="):
                    role, _, bind = line.removeprefix("BIND=").partition(" ")
                    found[role] = bind
        time.sleep(0.05)
    return found


def test_ps_servers_bind_their_nodes_address_unless_the_job_says(tmp_path: Path) -> None:
    argv = (sys.executable, "-c", PRINT_PS_BIND)
    for name, env, network, expected in (
        ("node", {}, NodeNetwork(), "tcp://10.0.0.2:0"),
        ("own", {"TIDAL_PS_BIND": "tcp://10.9.9.9:5555"}, NodeNetwork(), "tcp://10.9.9.9:5555"),
        ("local", {}, None, "-"),
    ):
        roles = [
            RoleLaunch("ps", argv, env=env, launcher="ps", ends_job=False),
            RoleLaunch("worker", argv, launcher="ps"),
        ]
        spec = WorkerSpec(argv=[], job_id=name, log_dir=tmp_path / name / "logs")
        groups = RoleGroups(spec, roles, network=network, work_dir=tmp_path / name / "job")
        try:
            groups.assign(["n2:0", "n1:0"])
            assert _binds(tmp_path / name, groups) == {"ps": expected, "worker": "-"}, name
        finally:
            groups.stop(grace=5)
