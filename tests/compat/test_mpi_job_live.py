"""An MPI-style job on a real ``tidal server``: a ``launcher`` role runs a real ``mpirun``
(Debian's Open MPI) over the host list the ``mpi`` launcher gives it, and every rank it
starts reports in. The ``worker`` role holds the slots the ranks run on, as an MPIJob's
worker pods do (they would run sshd across hosts; on one host ``mpirun`` starts the ranks
itself).
"""

from __future__ import annotations

import json
import shutil
import socket
import sys
from pathlib import Path

import pytest

from tests.controller.live import start_server, stop_server, until
from tidal.client import Client

RANKS = Path(__file__).resolve().parents[1] / "scripts" / "mpi_ranks.py"
TERMINAL = ("succeeded", "failed", "cancelled")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("mpirun") is None, reason="needs Open MPI's mpirun (make mpi installs it)"
    ),
]


def test_a_launcher_role_runs_mpirun_over_the_workers_host_list(tmp_path: Path) -> None:
    out = tmp_path / "ranks"
    out.mkdir()
    # The hostfile is written by the launcher, not by the script: keep a copy to check.
    launch = (
        f'cp "$TIDAL_HOSTFILE" {out}/hostfile && echo "$TIDAL_HOSTS" > {out}/hosts && '
        f"exec mpirun -np 2 {sys.executable} {RANKS} {out}"
    )
    spec = {
        "name": "mpi-ranks",
        "roles": [
            {
                "name": "launcher",
                "command": ["sh", "-c", launch],
                "replicas": 1,
                "launcher": "mpi",
                "ends_job": True,
                # Open MPI refuses root unless told twice (CI machines run as root).
                "env": {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"},
                "resources": {"gpus": 0},
            },
            {
                "name": "worker",
                "command": [sys.executable, "-c", "import time; time.sleep(600)"],
                "replicas": 2,
                "launcher": "mpi",
                "resources": {"gpus": 0},
            },
        ],
    }
    process = start_server(tmp_path, slots=3)
    try:
        with Client(data_dir=tmp_path / "data", timeout=30) as client:
            job = client.submit(spec).id
            until(lambda: client.get(job).state in TERMINAL, 180, "the MPI job ends")
            view = client.get(job)
            logs = client.logs(job, tail=40)
    finally:
        stop_server(process)
    assert view.state == "succeeded", (view.state, view.reason, logs)
    host = socket.gethostname()
    # The launcher was given the workers' slots: one host, two slots.
    assert (out / "hostfile").read_text() == f"{host} slots=2\n"
    assert (out / "hosts").read_text().strip() == f"{host}:2"
    ranks = sorted(json.loads(p.read_text())["rank"] for p in out.glob("rank-*.json"))
    assert ranks == [0, 1]
    for path in out.glob("rank-*.json"):
        record = json.loads(path.read_text())
        assert (record["size"], record["host"]) == (2, host)
