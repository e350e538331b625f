"""A real ``tidal server`` and a real training job while the store's resources go away:
the data dir's disk full (a real tmpfs), PostgreSQL stopped and started again. Writes are
answered 507 or 503 naming the cause, reads and the worker go on, the loop backs off with
one warning, and everything resumes by itself. And a finished job leaves a quiet server
log and only private files in the data dir."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import httpx
import pytest

from tests.controller.live import start_server, stop_server, until
from tests.controller.postgres import running_postgres
from tests.tmpfs import fill, mounted_tmpfs
from tidal.client import Client

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "step_counter.py"


def _spec(steps: Path, **extra: object) -> dict[str, object]:
    return {
        "name": "counter",
        # Lines of 500 bytes: a full disk's last page of the log fills within 8 steps.
        "command": [sys.executable, str(SCRIPT), str(steps), "--pad", "500"],
        "workers": 1,
        "checkpoint_every_seconds": 0,
        **extra,
    }


def _steps(path: Path) -> int:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


def _advances(path: Path, by: int, what: str) -> int:
    """Wait until the job's step counter moved ``by`` steps; the count then."""
    start = _steps(path)
    until(lambda: _steps(path) >= start + by, 120, what)
    return _steps(path)


def _http(client: Client) -> httpx.Client:
    return httpx.Client(base_url=client.url, headers=dict(client._http.headers), timeout=30)


def _server_log(tmp_path: Path) -> str:
    return (tmp_path / "server.log").read_text()


def _last_logged(data: Path, job: str) -> int:
    """The last step the job's log shows."""
    found = [
        line.split()[1] for line in _log_text(data, job).splitlines() if line.startswith("step ")
    ]
    return int(found[-1]) if found else 0


def _log_text(data: Path, job: str) -> str:
    return "".join(
        p.read_text() for p in sorted((data / "jobs" / job / "logs").glob("worker-*.log*"))
    )


def test_a_full_data_dir_costs_writes_only_and_everything_resumes(tmp_path: Path) -> None:
    steps = tmp_path / "steps"  # outside the data dir: it must not need the full disk
    with mounted_tmpfs(tmp_path / "data") as data:
        server = start_server(tmp_path, slots=2)
        try:
            with Client(data_dir=data, timeout=30) as client, _http(client) as http:
                # Periodic checkpoints too: each one due while the disk is full fails.
                job = client.submit(_spec(steps, checkpoint_every_steps=10)).id
                _advances(steps, 15, "the job's first steps")

                filler = fill(data)
                for response in (
                    http.post("/jobs", json=_spec(steps)),
                    http.post(f"/jobs/{job}/cancel"),
                ):
                    assert response.status_code == 507, response.text
                    assert response.json()["cause"] == "disk full"
                    assert response.json()["detail"].startswith(
                        f"disk full: no space left on the disk holding {data}"
                    )
                # Reads go on; the refused cancel was not recorded.
                assert http.get("/health").status_code == 200
                view = http.get(f"/jobs/{job}").json()
                assert view["state"] == "running" and not view["cancel_requested"]
                assert http.get(f"/jobs/{job}/logs", params={"tail": 5}).status_code == 200
                # The worker trains on, through checkpoints that cannot be written.
                _advances(steps, 40, "steps while the disk is full")

                filler.unlink()
                freed_at = _steps(steps)
                # Its log goes on by itself, saying how many lines were lost.
                # The log stopped when the disk filled: a later step is written only
                # once the sink found space again, after the notice of what it dropped.
                until(lambda: _last_logged(data, job) > freed_at, 120, "the log to resume")
                lines = _log_text(data, job).splitlines()
                notices = [line for line in lines if "lines dropped" in line]
                assert len(notices) == 1, notices
                assert notices[0].startswith("[tidal: ") and notices[0].endswith(
                    " lines dropped: the log was not writable]"
                )
                assert client.cancel(job).cancel_requested
                until(lambda: client.get(job).state == "cancelled", 120, "the cancel")
                assert client.submit(_spec(steps)).state == "queued"
        finally:
            stop_server(server)
        assert server.returncode == 0
        log = _server_log(tmp_path)
        # The loop said it when it began failing and when it recovered, not a tick: a
        # few times at most (a checkpoint that gave its space back may let a tick pass).
        failed = log.count("controller ticks fail (disk full: ")
        assert 1 <= failed == log.count("controller ticks succeed again") <= 3, log
        assert "Traceback" not in log, log


def test_postgresql_stopped_under_a_running_job(tmp_path: Path) -> None:
    steps = tmp_path / "steps"
    # A cluster of its own: stopping the session's one would fail other tests.
    with running_postgres() as postgres:
        server = start_server(tmp_path, "--db-url", postgres.new_database(), slots=2)
        try:
            with Client(data_dir=tmp_path / "data", timeout=30) as client, _http(client) as http:
                job = client.submit(_spec(steps)).id
                _advances(steps, 10, "the job's first steps")
                postgres.stop()
                try:
                    refused = http.post(f"/jobs/{job}/cancel")
                    assert refused.status_code == 503, refused.text
                    assert refused.headers["retry-after"] == "5"
                    assert refused.json()["cause"] == "unavailable"
                    assert refused.json()["detail"].startswith("store unavailable: postgresql")
                    assert http.get("/health").status_code == 200
                    # Down for tens of seconds: the loop's wait reaches its cap (0.5+1+2+4+5 s).
                    until(
                        lambda: _server_log(tmp_path).count("controller ticks fail") == 1,
                        60,
                        "the loop to notice",
                    )
                    _advances(steps, 400, "steps while the database is down")
                finally:
                    postgres.start()
                # The pool's connections are tested before use: the next request works.
                assert client.cancel(job).cancel_requested
                until(lambda: client.get(job).state == "cancelled", 120, "the cancel")
        finally:
            stop_server(server)
        assert server.returncode == 0
        log = _server_log(tmp_path)
        assert log.count("controller ticks fail (store unavailable: ") == 1, log
        assert log.count("controller ticks succeed again") == 1, log
        assert "Traceback" not in log, log


def test_a_finished_job_leaves_a_quiet_log_and_private_files(tmp_path: Path) -> None:
    steps = tmp_path / "steps"
    data = tmp_path / "data"
    server = start_server(tmp_path, slots=2)
    try:
        with Client(data_dir=data, timeout=30) as client:
            done = client.submit(
                {"name": "done", "command": [sys.executable, "-c", "print(1)"], "workers": 2}
            ).id
            # A job that checkpoints, cancelled: its agent ends after the backend let go.
            job = client.submit(_spec(steps, checkpoint_every_steps=5)).id
            _advances(steps, 12, "the job's steps")
            client.cancel(job)
            for ended in (done, job):
                until(
                    lambda e=ended: client.get(e).state in ("succeeded", "cancelled"),  # type: ignore[misc]
                    120,
                    f"{ended} to end",
                )
            until(
                lambda: (
                    len(list((data / "agents").glob("*.final.json"))) == 2
                    and not list((data / "agents").glob("*.agent.json"))
                ),
                60,
                "the agents to end",
            )
    finally:
        stop_server(server)
    assert server.returncode == 0
    log = _server_log(tmp_path)
    assert "recvValue failed" not in log and "TCPStore" not in log, log
    assert list((data / "jobs" / job / "checkpoints").glob("checkpoint-*.pt"))
    loose = []
    for path in [data, *data.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        expected = 0o700 if path.is_dir() else 0o600
        if mode != expected:
            loose.append(f"{path.relative_to(data)}: {mode:o}")
    assert loose == [], loose
