"""Cloudera ML's workers calls, written as its documentation writes them, against a real
``tidal server`` on 127.0.0.1 (local backend, real processes): ``launch_workers`` with
memory in GiB, ``nvidia_gpu`` and ``code``; ``await_workers`` on the dicts launch returned,
with ``wait_for_completion`` and ``timeout_seconds``; ``stop_workers(*worker_id)`` and
with none; ``list_workers``; and the variables that tell a worker where the launching
session and its peers are. A relative script is read from the caller's folder."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.controller.live import start_server, stop_server, until
from tidal.client import Client, cml

pytestmark = pytest.mark.slow

#: Runs until the file named by ``RELEASE`` in its environment exists (at most a minute).
WAIT_FOR_RELEASE = (
    "import os, time\n"
    "deadline = time.monotonic() + 60\n"
    "while not os.path.exists(os.environ['RELEASE']) and time.monotonic() < deadline:\n"
    "    time.sleep(0.05)\n"
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Client, Path]]:
    """One server for the module; the ``cml`` functions go through its client."""
    tmp_path = tmp_path_factory.mktemp("cml")
    process = start_server(tmp_path, slots=4)
    try:
        with Client(data_dir=tmp_path / "data", timeout=30) as client:
            cml.use(client)
            yield client, tmp_path
    finally:
        cml.use(None)
        stop_server(process)


def test_a_relative_script_is_read_from_the_callers_folder(
    live: tuple[Client, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _ = live
    (tmp_path / "work.py").write_text("open('done.txt', 'w').write('ok')\n")
    monkeypatch.chdir(tmp_path)
    ids = client.launch_workers(1, script="work.py")
    done = client.await_workers(ids, wait_for_completion=True, timeout_seconds=60)
    assert done["failures"] == [], client.logs(ids[0].split("/")[0])
    assert (tmp_path / "done.txt").read_text() == "ok"


def test_launch_takes_memory_in_gib_nvidia_gpu_and_code(
    live: tuple[Client, Path], tmp_path: Path
) -> None:
    client, _ = live
    out = tmp_path / "env"
    out.mkdir()
    names = ["CDSW_MASTER_ID", "CDSW_MASTER_IP", "CDSW_ENGINE_ID", "CDSW_IP_ADDRESS"]
    code = (
        "import json, os\n"
        f"names = {[*names, 'TIDAL_PEER_ADDRESSES']!r}\n"
        "values = {n: os.environ.get(n) for n in names}\n"
        f"path = os.path.join({str(out)!r}, values['CDSW_ENGINE_ID'].replace('/', '-'))\n"
        "open(path, 'w').write(json.dumps(values))\n"
    )
    workers = cml.launch_workers(n=2, cpu=0.2, memory=0.5, nvidia_gpu=0, code=code)
    assert [w["id"].rsplit("/", 1)[1] for w in workers] == ["0", "1"]
    job = client.get(workers[0]["id"].split("/")[0])
    assert job.spec is not None
    assert job.spec["resources"]["memory"] == 512 * 2**20
    assert job.spec["resources"]["gpus"] == 0
    done = cml.await_workers(workers)  # CML's default: wait for completion
    assert done["failures"] == []
    assert [w["id"] for w in done["workers"]] == [w["id"] for w in workers]
    assert {w["status"] for w in done["workers"]} == {"exited"}
    seen = [json.loads(p.read_text()) for p in sorted(out.iterdir())]
    assert [v["CDSW_ENGINE_ID"] for v in seen] == [w["id"] for w in workers]
    for values in seen:
        assert values["CDSW_MASTER_ID"] == client.session
        assert values["CDSW_MASTER_IP"] == "127.0.0.1"
        assert values["CDSW_IP_ADDRESS"] == "127.0.0.1"
        assert values["TIDAL_PEER_ADDRESSES"] == "127.0.0.1,127.0.0.1"


@pytest.mark.usefixtures("live")
def test_await_gives_up_after_timeout_seconds_with_the_dicts_of_the_late(tmp_path: Path) -> None:
    release = tmp_path / "release"
    workers = cml.launch_workers(2, 0.2, 0.25, code=WAIT_FOR_RELEASE, env={"RELEASE": str(release)})
    up = cml.await_workers(workers, wait_for_completion=False, timeout_seconds=60)
    assert up["failures"] == [] and len(up["workers"]) == 2
    late = cml.await_workers(workers, wait_for_completion=True, timeout_seconds=0.3)
    assert late["workers"] == []
    assert [w["id"] for w in late["failures"]] == [w["id"] for w in workers]
    release.touch()
    assert cml.await_workers(workers, timeout_seconds=60)["failures"] == []


def test_stop_workers_takes_ids_as_arguments_and_none_stops_them_all(
    live: tuple[Client, Path], tmp_path: Path
) -> None:
    client, _ = live
    env = {"RELEASE": str(tmp_path / "never")}
    first = cml.launch_workers(2, 0.2, 0.25, code=WAIT_FOR_RELEASE, env=env)
    second = cml.launch_workers(1, 0.2, 0.25, code=WAIT_FOR_RELEASE, env=env)
    assert cml.await_workers(first + second, wait_for_completion=False)["failures"] == []
    job = first[0]["id"].split("/")[0]
    assert cml.stop_workers(first[0]["id"], first[1]["id"]) == [job]
    until(lambda: client.get(job).state == "cancelled", 60, "the named workers' job to stop")
    other = second[0]["id"].split("/")[0]
    assert cml.stop_workers() == [other]  # none named: every running one of this session
    until(lambda: client.get(other).state == "cancelled", 60, "the session's workers to stop")


def test_list_workers_shows_this_sessions_workers(live: tuple[Client, Path]) -> None:
    _, tmp_path = live
    code = "import sys; sys.exit(3)"
    workers = cml.launch_workers(n=1, cpu=0.2, memory=0.25, code=code)
    failed = cml.await_workers(workers)
    assert [w["exit_code"] for w in failed["failures"]] == [3]
    listed = {w["id"]: w for w in cml.list_workers()}
    assert workers[0]["id"] in listed
    assert listed[workers[0]["id"]]["exit_code"] == 3
    assert set(listed[workers[0]["id"]]) >= {"id", "ip_address", "status", "exit_code"}
    with Client(data_dir=tmp_path / "data") as stranger:  # a session of its own
        assert workers[0]["id"] not in {w["id"] for w in stranger.list_workers()}
