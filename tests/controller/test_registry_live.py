"""A registered dataset and model trained from the CLI with parameters on a real server
(local backend, real worker processes): the script reads them from ``TIDAL_PARAMS``, its
data from ``TIDAL_DATASET``, and its output becomes a model version with its lineage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.controller.live import start_server, stop_server, until
from tidal.cli.main import controller_app, run_app
from tidal.client import Client

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "params_job.py"

pytestmark = pytest.mark.slow


def cli(capsys: pytest.CaptureFixture[str], data: Path, *argv: str) -> tuple[int, str, str]:
    code = run_app(controller_app, [*argv, "--data-dir", str(data)])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_model_trained_from_the_cli_reads_its_parameters_and_registers_a_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = tmp_path / "points"
    dataset.mkdir()
    (dataset / "data.csv").write_text("".join(f"{x},{3 * x}\n" for x in range(1, 5)))
    data = tmp_path / "data"
    process = start_server(tmp_path, slots=2)
    try:
        code, out, err = cli(capsys, data, "dataset", "register", "points", str(dataset))
        assert code == 0, err
        assert "registered dataset points version 1" in out
        code, out, err = cli(
            capsys,
            data,
            "model",
            "register",
            "line",
            "--code",
            str(SCRIPT.parent),
            "--entry",
            SCRIPT.name,
            "--dataset",
            "points",
            "--param",
            "epochs:int=1[1,50]",
            "--param",
            "lr:float=0.01[0,0.1]",
        )
        assert code == 0, err

        # Bad input: each refused naming the flag, and no job submitted.
        for argv, named in (
            (["--set", "epochs=0"], "--set epochs"),
            (["--set", "lr=fast"], "--set lr"),
            (["--set", "momentum=0.9"], "--set momentum"),
            (["--dataset", "nope"], "--dataset"),
        ):
            code, out, err = cli(capsys, data, "train", "line", *argv)
            assert code == 2, (argv, out, err)
            assert err.startswith("tidal: ") and named in err, err
        code, out, err = cli(capsys, data, "list", "--json")
        assert json.loads(out) == []

        code, out, err = cli(
            capsys, data, "train", "line", "--set", "epochs=20", "--set", "lr=0.02", "--json"
        )
        assert code == 0, err
        job_id = json.loads(out)["id"]
        with Client(data_dir=data, timeout=30) as client:
            assert client.wait(job_id, timeout=240).state == "succeeded"
            (version,) = client.model_versions("line")
            # The script's reports reach the version (its last one may come after the end).
            until(lambda: "rows" in client.model_versions("line")[0].metrics, 30, "metrics")
            assert client.model_versions("line")[0].metrics["rows"] == 4.0
        assert version.job_id == job_id and version.dataset == "points:1"
        assert version.params == {"epochs": 20, "lr": 0.02}
        assert version.checkpoint is not None
        written = json.loads((Path(version.checkpoint) / "model.json").read_text())
        assert written["params"] == {"epochs": 20, "lr": 0.02}
        assert abs(written["w"] - 3.0) < 0.01  # 20 epochs at 0.02 fit the line

        code, out, err = cli(capsys, data, "dataset", "describe", "points")
        assert code == 0 and "line:1" in out
        code, out, err = cli(capsys, data, "model", "versions", "line")
        assert code == 0 and job_id in out
        code, out, err = cli(capsys, data, "model", "alias", "line", "champion", "1")
        assert code == 0, err
        code, out, err = cli(capsys, data, "model", "describe", "line")
        assert code == 0 and "champion→1" in out and "epochs" in out
        code, out, err = cli(capsys, data, "dataset", "delete", "points:1")
        assert code == 1 and "line:1" in err
        code, out, err = cli(capsys, data, "dataset", "list")
        assert code == 0 and "points" in out
    finally:
        stop_server(process)
