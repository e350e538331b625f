"""What a new user meets first on the command line, against a real server process (its
jobs on the in-memory backend): a negative priority is a number, a flag's error names the
flag, a misspelt field gets a suggestion, ``tidal top`` piped writes a snapshot, reasons
stay whole at 80 columns, workers of two GPUs are counted as workers, the first start
prints no Alembic steps, and SIGTERM ends open log streams instead of cutting them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.controller.live import until
from tests.controller.test_cli import ROOT, run, start_server, stop_server
from tidal.client import Client

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One server for the module; its data dir."""
    data_dir = tmp_path_factory.mktemp("first-contact") / "data"
    proc = start_server(data_dir)
    try:
        yield data_dir
    finally:
        stop_server(proc, signal.SIGINT)


def _cli(data_dir: Path, *argv: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    """``tidal ARGV`` as a process whose output is a pipe, ``columns`` wide."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "COLUMNS": str(columns),
    }
    return subprocess.run(
        [sys.executable, "-m", "tidal.cli", *argv, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_priority_takes_a_negative_number(capsys: pytest.CaptureFixture[str], server: Path) -> None:
    with Client(data_dir=server) as client:
        job = client.submit({"name": "prio", "command": ["python", "t.py"]})
    code, _, err = run(capsys, "priority", job.id, "-1", "--data-dir", str(server))
    assert "No such option" not in err
    # Read as the number -1, and refused for what it is: the range names N.
    assert code == 2 and err.startswith("tidal: N: ") and "greater than or equal to 1" in err
    code, out, _ = run(capsys, "priority", job.id, "7", "--data-dir", str(server))
    assert code == 0 and "priority 7" in out


@pytest.mark.parametrize(
    ("flags", "named", "not_named"),
    [
        (["--workers", "0:2"], "--workers: ", "workers.min"),
        (["--workers", "3", "--min-workers", "1", "--max-workers", "2"], "--workers", "workers."),
        (["--priority", "0"], "--priority: ", "priority:"),
    ],
)
def test_a_flags_error_names_the_flag(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    flags: list[str],
    named: str,
    not_named: str,
) -> None:
    code, out, err = run(
        capsys, "submit", "--name", "x", *flags, "--data-dir", str(tmp_path), "--", "python"
    )
    assert (code, out) == (2, "")
    assert named in err
    assert not_named not in err.replace(named, "")


def test_an_unknown_field_gets_the_likely_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: a\ncommand: python t.py\nworker: 3\nresources: {gpu: 1}\n")
    code, _, err = run(capsys, "submit", str(spec), "--data-dir", str(tmp_path))
    assert code == 2
    assert "worker: unknown field (did you mean `workers`?)" in err
    assert "resources.gpu: unknown field (did you mean `gpus`?)" in err


def test_top_writes_one_snapshot_when_piped(server: Path) -> None:
    done = _cli(server, "top")
    assert done.returncode == 0, done.stderr
    assert "slots used" in done.stdout and "HOST" in done.stdout


def test_reasons_stay_whole_at_80_columns(server: Path) -> None:
    with Client(data_dir=server) as client:
        wide = client.submit(
            {"name": "wide-reason", "command": ["python", "t.py"], "workers": "3:3"}
        )
        until(lambda: client.get(wide.id).state == "running", 60, "the first job to run")
        queued = client.submit({"name": "waits", "command": ["python", "t.py"], "workers": 2})
        until(lambda: bool(client.get(queued.id).reason), 60, "a reason for the queued job")
        reason = client.get(queued.id).reason
        assert len(reason) > 10
        for verb in (["list"], ["get", queued.id]):
            shown = _cli(server, *verb)
            assert shown.returncode == 0, shown.stderr
            assert max(len(line) for line in shown.stdout.splitlines()) <= 80, shown.stdout
            assert f"{queued.id}: {reason}" in shown.stdout, shown.stdout
        client.cancel(wide.id)
        client.cancel(queued.id)
        client.wait(wide.id, timeout=60)
        client.wait(queued.id, timeout=60)


def test_workers_of_two_gpus_are_counted_as_workers(
    capsys: pytest.CaptureFixture[str], server: Path
) -> None:
    d = ["--data-dir", str(server)]
    with Client(data_dir=server) as client:
        job = client.submit(
            {"name": "pairs", "command": ["python", "t.py"], "workers": "1:2",
             "resources": {"gpus": 2}}
        )  # fmt: skip
        until(lambda: len(client.get(job.id).slots) == 4, 60, "two workers of two slots")
        view = client.get(job.id)
        assert view.worker_counts is not None
        assert (view.worker_counts.now, view.worker_counts.min, view.worker_counts.max) == (2, 1, 2)
        assert view.worker_counts.slots_per_worker == 2
        listed = _cli(server, "list").stdout
        row = next(line for line in listed.splitlines() if line.startswith(f" {job.id}"))
        assert "2 [1-2] ×2" in row, listed
        shown = _cli(server, "get", job.id).stdout
        assert "slots: 4 held, 2 per worker (min 2, max 4)" in shown, shown
        code, out, _ = run(capsys, "scale", job.id, "--workers", "1", *d)
        assert (code, out) == (0, f"{job.id}: target 1 worker(s) (2 slots)\n")
        code, out, _ = run(capsys, "get", job.id, "--json", *d)
        assert json.loads(out)["worker_counts"]["target"] == 1
        client.cancel(job.id)
        client.wait(job.id, timeout=60)


def test_the_first_start_prints_no_alembic_steps_and_sigterm_ends_log_streams(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    proc = start_server(data_dir)
    try:
        with Client(data_dir=data_dir) as client:
            job = client.submit({"name": "streamed", "command": ["python", "t.py"]})
            until(lambda: client.get(job.id).state == "running", 60, "the job to run")
            lines = client.follow_logs(job.id, tail=1)
            assert next(lines).startswith("[")
            proc.send_signal(signal.SIGTERM)
            # The stream ends as the server stops: no cut connection (ServerUnavailable).
            rest = list(lines)
            assert all(line.startswith("[") or not line for line in rest)
    finally:
        code = stop_server(proc, signal.SIGTERM)
    output = proc.stdout.read() if proc.stdout else ""
    assert code == 0, output
    assert "alembic" not in output, output
    assert "graceful shutdown exceeded" not in output, output
