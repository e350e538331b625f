"""The CLI verbs: one-line errors with exit status 2, and a real server end to end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidal.cli.main import controller_app, run_app
from tidal.cli.options import parse_duration
from tidal.spec import JobSpec
from tidal.wire.discovery import read_server_info
from tidal.wire.schema import JobView

ROOT = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = run_app(controller_app, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["submit", "--name", "x", "--workers", "1:x", "--", "python", "t.py"], "--workers"),
        (["submit", "--name", "x", "--label", "oops", "--", "python"], "--label"),
        (["submit"], "ARGS"),
        (["scale", "job", "--workers", "many"], "--workers"),
        (["scale", "job", "--workers", "0"], "--workers"),
        (["scale-out", "job", "--count", "1", "--timeout", "soon"], "--timeout"),
        (["priority", "job"], "'N'"),
        (["list", "--label", "team"], "--label"),
        (["server", "--policy", "nope", "--slots", "1"], "--policy"),
        (["server", "--autoscale", "--slots", "1"], "--autoscale"),
        (["server", "--max-slots", "8", "--slots", "1"], "--max-slots"),
        (["server", "--autoscale", "--max-slots", "0", "--backend", "ray"], "--max-slots"),
        (["server", "--standby-workers", "-1", "--slots", "1"], "--standby-workers"),
        (["frobnicate", "x"], "frobnicate"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], names: str
) -> None:
    code, out, err = run(capsys, *argv, "--data-dir", str(tmp_path))
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("tidal: ")
    assert names in err
    assert not (tmp_path / "token").exists()


def test_autoscale_on_a_backend_that_cannot_grow_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A plugin backend is loaded before it can be asked; the error still names the flag."""
    backend = "tests.controller.fakes:FakeBackend"
    code, out, err = run(
        capsys, "server", "--autoscale", "--backend", backend, "--data-dir", str(tmp_path)
    )
    assert code == 2
    assert out == ""
    last = err.strip().splitlines()[-1]
    assert last.startswith("tidal: ") and "--autoscale" in last and backend in last, err
    assert not (tmp_path / "token").exists()


def test_bad_spec_file_lists_every_problem(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: Bad\ncommand: python t.py\nworkers: 4:2\npriority: -1\n")
    code, _, err = run(capsys, "submit", str(spec), "--data-dir", str(tmp_path))
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    for path in ("name:", "workers.min:", "priority:"):
        assert path in err


def test_spec_file_working_dir_is_relative_to_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[JobSpec] = []

    def submit(self: object, spec: JobSpec) -> JobView:
        sent.append(spec)
        return JobView.model_construct(id="a-1", state="queued")

    monkeypatch.setattr("tidal.client.Client.submit", submit)
    (tmp_path / "jobs").mkdir()
    spec = tmp_path / "jobs" / "job.yaml"
    spec.write_text("name: a\ncommand: python t.py\nworking_dir: ../code\n")
    code, out, _ = run(capsys, "submit", str(spec), "--url", "http://127.0.0.1:9", "--token", "t")
    assert code == 0, out
    assert sent[0].working_dir == str((tmp_path / "code").resolve())


@pytest.mark.parametrize(
    "argv",
    [["a-1", "3"], ["a-1", "--workers", "3"], ["a-1", "3", "--workers", "3"]],
    ids=["positional", "flag", "both-agreeing"],
)
def test_scale_takes_the_count_as_argument_or_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    asked: list[tuple[str, int, str | None]] = []

    def scale(self: object, job: str, workers: int, role: str | None = None) -> JobView:
        asked.append((job, workers, role))
        return JobView.model_construct(id=job, target_workers=workers)

    monkeypatch.setattr("tidal.client.Client.scale", scale)
    where = ["--url", "http://127.0.0.1:9", "--token", "t"]
    code, out, err = run(capsys, "scale", *argv, *where)
    assert (code, err) == (0, "")
    assert asked == [("a-1", 3, None)]
    assert out == "a-1: target 3 worker(s)\n"


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["a-1", "3", "--workers", "4"], ["--workers", "3", "4"]),
        (["a-1"], ["N", "--workers"]),
        (["a-1", "0"], ["N"]),
    ],
    ids=["both-differing", "neither", "zero"],
)
def test_scale_count_problems_name_the_argument(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    names: list[str],
) -> None:
    def scale(*args: object, **kwargs: object) -> JobView:
        raise AssertionError("nothing is sent")

    monkeypatch.setattr("tidal.client.Client.scale", scale)
    where = ["--url", "http://127.0.0.1:9", "--token", "t"]
    code, out, err = run(capsys, "scale", *argv, *where)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("tidal: ")
    for name in names:
        assert name in err


def test_no_server_is_exit_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "list", "--data-dir", str(tmp_path))
    assert code == 1
    assert "no server found" in err


def test_parse_duration() -> None:
    assert parse_duration("10m") == 600
    assert parse_duration("90") == 90
    assert parse_duration("1.5h") == 5400
    with pytest.raises(ValueError):
        parse_duration("0s")


def start_server(data_dir: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidal.cli",
            "server",
            "--slots",
            "4",
            "--data-dir",
            str(data_dir),
            "--backend",
            "tests.controller.fakes:FakeBackend",
            "--policy",
            "tests.controller.fakes:GreedyPolicy",
            "--interval",
            "0.05",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 30
    while read_server_info(data_dir) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server(proc, signal.SIGKILL)
            pytest.fail(f"server did not start: {proc.stdout.read() if proc.stdout else ''}")
        time.sleep(0.05)
    return proc


def stop_server(proc: subprocess.Popen[str], sig: int) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        raise


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Path]:
    data_dir = tmp_path / "data"
    proc = start_server(data_dir)
    try:
        yield data_dir
    finally:
        code = stop_server(proc, signal.SIGINT)
    assert code == 0, proc.stdout.read() if proc.stdout else ""
    assert read_server_info(data_dir) is None


def test_sigterm_stops_the_server_cleanly(tmp_path: Path) -> None:
    proc = start_server(tmp_path)
    assert stop_server(proc, signal.SIGTERM) == 0
    assert read_server_info(tmp_path) is None
    assert (tmp_path / "token").stat().st_mode & 0o777 == 0o600


def test_verbs_against_a_real_server(capsys: pytest.CaptureFixture[str], server: Path) -> None:
    d = ["--data-dir", str(server)]
    code, out, _ = run(
        capsys, "submit", "--name", "mnist", "--workers", "1:4", "--priority", "7000", "--json",
        *d, "--", "python", "train.py", "--lr", "0.1",
    )  # fmt: skip
    assert code == 0
    job = json.loads(out)
    assert job["spec"]["command"] == ["python", "train.py", "--lr", "0.1"]
    assert job["priority"] == 7000
    assert job["spec"]["working_dir"] == str(Path.cwd().resolve())

    def state() -> dict[str, object]:
        code, out, _ = run(capsys, "get", job["id"], "--json", *d)
        assert code == 0
        return json.loads(out)  # type: ignore[no-any-return]

    # Bounds for a loaded machine; the loops end as soon as the state is reached.
    deadline = time.monotonic() + 60
    while state()["workers"] != 4:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    code, out, _ = run(capsys, "list", *d)
    assert code == 0 and job["id"] in out and "running" in out
    code, out, _ = run(capsys, "cluster", "--json", *d)
    assert json.loads(out)["used_slots"] == 4
    code, out, _ = run(capsys, "logs", job["id"], "--tail", "1", "--worker", "0", *d)
    assert out == "[0] worker 0 line 4\n"
    code, _, err = run(capsys, "scale", job["id"], "--workers", "9", *d)
    assert code == 2 and "workers: must be within [1, 4]" in err
    code, _, err = run(capsys, "scale", job["id"], "--workers", "2", "--role", "ps", *d)
    assert code == 2 and "role: job " in err and "has no role 'ps' (it has ['worker'])" in err
    code, _, _ = run(capsys, "scale-in", job["id"], "--count", "2", *d)
    assert code == 0
    deadline = time.monotonic() + 60
    while state()["workers"] != 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    code, out, _ = run(capsys, "scale", job["id"], "2", *d)
    assert code == 0 and "target 2 worker(s)" in out
    code, _, err = run(capsys, "scale", job["id"], "9", *d)
    assert code == 2 and "workers: must be within [1, 4]" in err
    code, out, _ = run(capsys, "priority", job["id"], "9000", *d)
    assert code == 0 and "priority 9000" in out
    code, out, _ = run(capsys, "top", "--iterations", "1", *d)
    assert code == 0 and job["id"] in out
    code, out, _ = run(capsys, "cancel", job["id"], "--wait", "--json", *d)
    assert code == 0 and json.loads(out)["state"] == "cancelled"
    code, _, err = run(capsys, "get", "nope", *d)
    assert code == 1 and "no job 'nope'" in err


def test_policy_options_are_converted_and_checked() -> None:
    from tidal.controller.plugins import PluginError, load_policy
    from tidal.policy.goodput import GoodputPolicy

    policy = load_policy("goodput", {"reallocation_delay": "5", "prior_sync": "0.1"})
    assert isinstance(policy, GoodputPolicy)
    assert (policy.reallocation_delay, policy.prior_sync) == (5.0, 0.1)
    with pytest.raises(PluginError, match="no option 'speed'"):
        load_policy("goodput", {"speed": "1"})
    with pytest.raises(PluginError, match="not a number"):
        load_policy("goodput", {"reallocation_delay": "soon"})
