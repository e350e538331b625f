"""What a new user meets first: Arena's quoted command, paths checked at submission, a
crash loop that backs off and says why, a torchrun script under the wrong launcher."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from tests.controller.conftest import Served
from tests.controller.fakes import FakeBackend, GreedyPolicy
from tests.controller.test_loop import Clock, job, make, submit
from tidal.backends.local import LocalBackend
from tidal.cli.main import controller_app, run_app
from tidal.controller.cluster import ClusterModel
from tidal.controller.loop.controller import Controller
from tidal.controller.routes.auth import ensure_token
from tidal.controller.routes.spec_body import check_runnable
from tidal.controller.store.jobs import JobStore
from tidal.controller.support import LOCAL, entry_script
from tidal.launch.api import WorkerState
from tidal.model import JobState
from tidal.policy.api import Slot
from tidal.server.app import create_app
from tidal.server.process import ApiServer
from tidal.spec import SpecError, parse_spec, parse_spec_yaml


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = run_app(controller_app, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def at(served: Served) -> list[str]:
    return ["--url", served.url, "--token", served.token]


# -- Arena's quoted command --------------------------------------------------------------


def test_arena_quoted_command_is_split_and_shown_as_stored(
    capsys: pytest.CaptureFixture[str], served: Served, tmp_path: Path
) -> None:
    code, out, err = run(
        capsys, "submit", "--name=elastic-training", "--gpus=0", "--workers=3",
        "--max-workers=9", "--min-workers=1", f"--working-dir={tmp_path}", "--json",
        *at(served), "python train.py --epochs 60",
    )  # fmt: skip
    assert code == 0, err
    stored = json.loads(out)
    assert stored["spec"]["command"] == ["python", "train.py", "--epochs", "60"]
    code, out, _ = run(capsys, "get", stored["id"], *at(served))
    assert code == 0
    assert "command: python train.py --epochs 60" in out


def test_get_quotes_an_argument_with_blanks(
    capsys: pytest.CaptureFixture[str], served: Served
) -> None:
    code, out, _ = run(
        capsys, "submit", "--name", "q", "--json", *at(served),
        "--", "python", "my script.py", "--note", "a b",
    )  # fmt: skip
    assert code == 0
    job_id = json.loads(out)["id"]
    code, out, _ = run(capsys, "get", job_id, *at(served))
    assert "command: python 'my script.py' --note 'a b'" in out


def test_one_rule_for_yaml_json_and_flags() -> None:
    text = parse_spec_yaml("name: a\ncommand: python train.py --epochs 60\n")
    listed = parse_spec_yaml("name: a\ncommand: ['python train.py --epochs 60']\n")
    flags = parse_spec({"name": "a", "command": ["python train.py --epochs 60"]})
    assert text.command == listed.command == flags.command
    assert flags.command == ["python", "train.py", "--epochs", "60"]
    # A role's command follows the same rule.
    roles = parse_spec(
        {"name": "a", "roles": [{"name": "worker", "command": ["python w.py -x 1"]}]}
    )
    assert roles.roles is not None and roles.roles[0].command == ["python", "w.py", "-x", "1"]
    # Several elements are kept as they are: an argument may hold a blank.
    assert parse_spec({"name": "a", "command": ["python", "a b.py"]}).command == [
        "python",
        "a b.py",
    ]


# -- Arena's --workers is a target -------------------------------------------------------


def test_arena_workers_is_a_target_shown_by_get(
    capsys: pytest.CaptureFixture[str], served: Served
) -> None:
    code, out, err = run(
        capsys, "submit", "--name=et", "--gpus=0", "--workers=2", "--min-workers=1",
        "--max-workers=4", "--json", *at(served), "python train.py",
    )  # fmt: skip
    assert code == 0, err
    job_id = json.loads(out)["id"]
    for _ in range(3):
        served.controller.tick()
    # Four slots are free, yet the job stays at the two workers its user asked for.
    code, out, _ = run(capsys, "get", job_id, *at(served))
    assert "size: 2 worker(s), target 2 (--workers / workers.initial; 1-4): at its target" in out
    code, out, _ = run(capsys, "scale-out", job_id, "--count", "1", *at(served))
    assert code == 0 and "target 3 worker(s)" in out
    for _ in range(3):
        served.controller.tick()
    code, out, _ = run(capsys, "get", job_id, *at(served))
    assert "size: 3 worker(s), target 3 (set by scale; 1-4): at its target" in out
    # Without a target a job grows into the idle slot, and says so.
    code, out, _ = run(capsys, "submit", "--name=free", "--workers=1:4", "--json", *at(served), "x")
    free = json.loads(out)["id"]
    for _ in range(3):
        served.controller.tick()
    code, out, _ = run(capsys, "get", free, *at(served))
    assert "size: 1 worker(s), no target: grows into idle slots up to 4" in out


def test_size_line_of_a_fixed_job_and_of_one_above_its_target() -> None:
    from tidal.cli.tables import size_line
    from tidal.wire.schema import JobView

    fixed = {"workers": {"min": 2, "max": 2}, "resources": {"gpus": 1}}
    view = JobView.model_construct(
        workers=2, min_slots=2, max_slots=2, target_slots=None, state="running", spec=fixed
    )
    assert size_line(view) == "size: 2 worker(s) of a fixed 2"
    # Two-GPU workers: counted in workers, not slots.
    wide = {"workers": {"min": 1, "max": 4, "initial": 2}, "resources": {"gpus": 2}}
    view = JobView.model_construct(
        workers=6, min_slots=2, max_slots=8, target_slots=None, state="running", spec=wide
    )
    assert size_line(view) == (
        "size: 3 worker(s), target 2 (--workers / workers.initial; 1-4): "
        "1 above it: idle slots lent, or a shrink under way"
    )
    roles = {"roles": [{"name": "ps"}]}
    assert size_line(JobView.model_construct(spec=roles)) is None


# -- paths checked at submission ---------------------------------------------------------


@pytest.fixture
def local_served(tmp_path: Path) -> Iterator[Served]:
    """A real API server over the local backend (no job is started: nothing ticks)."""
    data_dir = tmp_path / "data"
    token = ensure_token(data_dir)
    store = JobStore.open(data_dir)
    backend = LocalBackend(data_dir)
    controller = Controller(
        store, ClusterModel.single(2, name="h"), GreedyPolicy(), backend, data_dir
    )
    server = ApiServer(create_app(controller, token))
    server.start()
    try:
        yield Served(server.url, token, data_dir, store, FakeBackend(), controller)
    finally:
        server.stop()
        backend.close()
        store.close()


def test_missing_working_dir_is_refused_naming_the_field(
    capsys: pytest.CaptureFixture[str], local_served: Served, tmp_path: Path
) -> None:
    nowhere = tmp_path / "nowhere"
    code, out, err = run(
        capsys, "submit", "--name", "a", "--working-dir", str(nowhere), *at(local_served),
        "--", "python", "train.py",
    )  # fmt: skip
    assert code == 2, out
    assert "working_dir: no such directory on the server's host" in err
    assert str(nowhere) in err
    assert local_served.store.list_jobs() == []


def test_missing_script_is_refused_naming_the_field(
    capsys: pytest.CaptureFixture[str], local_served: Served, tmp_path: Path
) -> None:
    code, out, err = run(
        capsys, "submit", "--name", "a", "--working-dir", str(tmp_path), *at(local_served),
        "--", "python", "-u", "does_not_exist.py",
    )  # fmt: skip
    assert code == 2, out
    assert "command: no such file on the server's host" in err
    assert str(tmp_path / "does_not_exist.py") in err
    assert local_served.store.list_jobs() == []
    # The same job with its script there is accepted; so are modules and code.
    (tmp_path / "does_not_exist.py").write_text("print(1)\n")
    for command in (["python", "-u", "does_not_exist.py"], ["python", "-m", "json.tool"]):
        code, out, err = run(
            capsys, "submit", "--name", "a", "--working-dir", str(tmp_path),
            *at(local_served), "--", *command,
        )  # fmt: skip
        assert code == 0, err
        local_served.client().cancel(out.split()[1])


def test_a_torchrun_script_under_tidals_launcher_is_warned_of(
    capsys: pytest.CaptureFixture[str], local_served: Served, tmp_path: Path
) -> None:
    (tmp_path / "ddp.py").write_text(
        "import os\nimport torch.distributed as dist\n"
        "dist.init_process_group('gloo')\nprint(os.environ['LOCAL_RANK'])\n"
    )
    (tmp_path / "elastic.py").write_text("import tidal\ndist.init_process_group('gloo')\n")
    base = ["submit", "--name", "a", "--working-dir", str(tmp_path), *at(local_served)]
    code, _, err = run(capsys, *base, "--", "python", "ddp.py")
    assert code == 0, err
    assert "warning: launcher: ddp.py looks written for torchrun" in err
    assert "--launcher torchrun" in err
    for flags in (["--launcher", "torchrun", "--", "python", "ddp.py"], ["python elastic.py"]):
        code, _, err = run(capsys, *base, *flags)
        assert code == 0 and "warning" not in err, err


def test_paths_are_not_checked_where_workers_run_elsewhere(tmp_path: Path) -> None:
    spec = parse_spec(
        {"name": "a", "command": "python gone.py", "working_dir": str(tmp_path / "elsewhere")}
    )
    check_runnable(spec, LOCAL)  # a backend that does not share this host's files
    with pytest.raises(SpecError) as refused:
        check_runnable(spec, LocalBackend.capabilities)
    assert [p for p, _ in refused.value.problems] == ["working_dir"]
    ray = pytest.importorskip("tidal.backends.ray.backend")
    assert not ray.RayBackend.capabilities.shared_files
    check_runnable(spec, ray.RayBackend.capabilities)


def test_entry_script() -> None:
    assert entry_script(["python", "train.py", "--x"]) == "train.py"
    assert entry_script(["python3.11", "-u", "-W", "ignore", "t.py"]) == "t.py"
    assert entry_script(["/usr/bin/python3", "-m", "pkg"]) is None
    assert entry_script(["python", "-c", "print(1)"]) is None
    assert entry_script(["./run.sh", "a"]) == "./run.sh"
    assert entry_script(["torchrun", "t.py"]) is None


# -- crash loop --------------------------------------------------------------------------


class JoiningLater(FakeBackend):
    """New workers start ``starting`` (not yet in their group), as a real one does."""

    def _apply(self, job: object, slots: tuple[Slot, ...]) -> None:
        first = self._next_worker
        super()._apply(job, slots)  # type: ignore[arg-type]
        workers = job.workers  # type: ignore[attr-defined]
        for i, w in enumerate(workers):
            if w.worker_id >= first and w.state is WorkerState.RUNNING:
                workers[i] = replace(w, state=WorkerState.STARTING)

    def crash(self, job_id: str, cause: str) -> None:
        """The live worker exits 1 with ``cause`` before joining."""
        workers = self.jobs[job_id].workers
        i = next(i for i, w in enumerate(workers) if w.state.alive)
        workers[i] = replace(workers[i], state=WorkerState.FAILED, exit_code=1, cause=cause)


MISSING = "FileNotFoundError: [Errno 2] No such file or directory: 'data/train.csv'"


def test_crash_loop_backs_off_and_says_why(tmp_path: Path) -> None:
    clock = Clock()
    store = JobStore.open(tmp_path)
    try:
        backend = JoiningLater()
        ctl, _ = make(store, tmp_path, clock, slots=1, backend=backend)
        a = submit(store, clock, workers="1:1", restart={"max_restarts": 5})
        ctl.tick()
        ctl.tick()
        backend.crash(a.id, MISSING)
        ctl.tick()
        got = job(store, a.id)
        assert got.restarts == 1 and got.state is JobState.RESCALING
        assert "before joining; starting it again" in got.reason
        assert "checkpoint" not in got.reason  # it never started: nothing to resume
        assert backend.alive(a.id)  # the first failure is retried at once
        starts = len([c for c in backend.calls if c[0] == "assign"])

        backend.crash(a.id, MISSING)
        ctl.tick()
        got = job(store, a.id)
        assert got.restarts == 2
        assert "crash loop" in got.reason and MISSING in got.reason
        assert "next start in 10s" in got.reason
        assert not backend.alive(a.id)  # backing off
        clock.now += 9
        ctl.tick()
        assert not backend.alive(a.id)
        assert len([c for c in backend.calls if c[0] == "assign"]) == starts
        clock.now += 1
        ctl.tick()
        assert backend.alive(a.id)  # the back-off is over

        backend.crash(a.id, MISSING)
        ctl.tick()
        assert "next start in 20s" in job(store, a.id).reason
        clock.now += 20
        ctl.tick()
        # A different error is no loop: retried at once.
        backend.crash(a.id, "ImportError: no module named 'tqdm'")
        ctl.tick()
        got = job(store, a.id)
        assert "starting it again" in got.reason and backend.alive(a.id)
        kinds = [e.data.get("loop_count") for e in store.events(a.id) if e.kind == "worker_failed"]
        assert kinds == [1, 2, 3, 1]
    finally:
        store.close()


def test_torchrun_script_under_tidal_launcher_fails_naming_the_flag(tmp_path: Path) -> None:
    clock = Clock()
    store = JobStore.open(tmp_path)
    try:
        backend = JoiningLater()
        ctl, _ = make(store, tmp_path, clock, slots=1, backend=backend)
        a = submit(store, clock, workers="1:1")
        ctl.tick()
        ctl.tick()
        backend.crash(
            a.id,
            "ValueError: Error initializing torch.distributed using env:// rendezvous: "
            "environment variable RANK expected, but not set",
        )
        ctl.tick()
        got = job(store, a.id)
        assert got.state is JobState.FAILED
        assert got.restarts == 0
        assert "--launcher torchrun" in got.reason
    finally:
        store.close()


# -- the same, with real workers ---------------------------------------------------------


@pytest.mark.slow
def test_real_workers_failing_before_joining(tmp_path: Path) -> None:
    from tests.controller.live import start_server, stop_server, until
    from tidal.client import Client

    process = start_server(tmp_path, slots=2)
    try:
        with Client(data_dir=tmp_path / "data", timeout=30) as client:
            looping = client.submit(
                {
                    "name": "loop",
                    "command": [sys.executable, "-c", "open('data/train.csv')"],
                    "working_dir": str(tmp_path),
                    "workers": 1,
                    "restart": {"max_restarts": 2},
                }
            )
            torchrun = client.submit(
                {
                    "name": "ddp",
                    "command": [
                        sys.executable,
                        "-c",
                        "import torch.distributed as d; d.init_process_group('gloo')",
                    ],
                    "working_dir": str(tmp_path),
                    "workers": 1,
                }
            )
            ended = ("failed", "succeeded", "cancelled")
            until(lambda: client.get(torchrun.id).state in ended, 120, "the ddp job to end")
            view = client.get(torchrun.id)
            assert view.state == "failed" and view.restarts == 0
            assert "--launcher torchrun" in view.reason
            until(lambda: client.get(looping.id).state in ended, 180, "the looping job to end")
            view = client.get(looping.id)
            assert view.state == "failed"
            assert "before joining" in view.reason and "FileNotFoundError" in view.reason
            said = [e.message for e in client.events(looping.id) if e.kind == "worker_failed"]
            assert "starting it again" in said[0] and "checkpoint" not in said[0]
            assert said[1].startswith("crash loop: ") and "next start in 10s" in said[1]
            assert "data/train.csv" in said[1]
    finally:
        stop_server(process)


# -- tidal export ------------------------------------------------------------------------


def test_export_needs_an_image_and_adds_no_backoff_limit(
    capsys: pytest.CaptureFixture[str], served: Served, tmp_path: Path
) -> None:
    manifest = tmp_path / "pt.yaml"
    manifest.write_text(
        "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: pt}\nspec:\n"
        "  elasticPolicy: {minReplicas: 1, maxReplicas: 3}\n  pytorchReplicaSpecs:\n"
        "    Worker:\n      replicas: 2\n      template:\n        spec:\n"
        "          containers:\n          - name: pytorch\n            image: x\n"
        "            command: [python, t.py]\n"
    )
    code, out, err = run(capsys, "submit", str(manifest), "--json", *at(served))
    assert code == 0, err
    job_id = json.loads(out)["id"]
    code, out, err = run(capsys, "export", job_id, "--as", "pytorchjob", *at(served))
    assert code == 2 and out == ""
    assert "--image" in err and "Kubernetes needs" in err
    code, out, err = run(
        capsys, "export", job_id, "--as", "pytorchjob", "--image", "reg/t:1", *at(served)
    )
    assert code == 0, err
    written = yaml.safe_load(out)
    assert "runPolicy" not in written["spec"]  # the original set no backoffLimit
    worker = written["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert worker["template"]["spec"]["containers"][0]["image"] == "reg/t:1"
