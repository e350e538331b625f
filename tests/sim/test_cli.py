"""``tidal sim`` commands end to end on a tiny workload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tidal.sim.cli import sim_app

WORKLOAD = (
    "name,time,application,num_replicas,batch_size\nncf-0,0,ncf,1,256\ncifar10-1,30,cifar10,2,256\n"
)


def test_run_prints_a_summary_and_writes_one_line_per_job(traces: Path, tmp_path: Path) -> None:
    workload = tmp_path / "workload-1.csv"
    workload.write_text(WORKLOAD)
    output = tmp_path / "results.jsonl"
    result = CliRunner().invoke(
        sim_app,
        [
            "run",
            "--workload",
            str(workload),
            "--profiles",
            str(traces / "pollux" / "profiles"),
            "--policy",
            "fairshare",
            "--nodes",
            "2",
            "--realloc-cost",
            "1",
            "--output",
            str(output),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "fairshare" in result.output
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    assert [line["name"] for line in lines] == ["ncf-0", "cifar10-1"]
    assert all(line["jct"] > 0 for line in lines)


def test_compare_writes_a_table_and_charts(traces: Path, tmp_path: Path) -> None:
    for i in (1, 2):
        (tmp_path / f"workload-{i}.csv").write_text(WORKLOAD)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        sim_app,
        [
            "compare",
            "--workloads",
            str(tmp_path),
            "--profiles",
            str(traces / "pollux" / "profiles"),
            "--policies",
            "static,goodput",
            "--nodes",
            "2",
            "--output-dir",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    table = (out / "comparison.md").read_text()
    assert "| workload-1 |" in table and "goodput" in table
    for chart in ("jct_cdf.png", "gpus_per_job.png"):
        assert (out / chart).read_bytes()[:4] == b"\x89PNG"


def test_unknown_policy_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        sim_app, ["run", "--policy", "nope", "--workload", str(tmp_path / "x.csv")]
    )
    assert result.exit_code != 0


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["run", "--profiles", "{missing}"], "--profiles"),
        (["run", "--workload", "{missing}", "--profiles", "{profiles}"], "--workload"),
        (["run", "--philly", "{missing}", "--profiles", "{profiles}"], "--philly"),
        (["compare", "--workloads", "{missing}", "--profiles", "{profiles}"], "--workloads"),
        (["compare", "--workloads", "{empty}", "--profiles", "{missing}"], "--profiles"),
    ],
)
def test_a_missing_path_is_a_usage_error_naming_its_flag(
    traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], flag: str
) -> None:
    (tmp_path / "workload-1.csv").write_text(WORKLOAD)
    # Short relative paths: the error box wraps at 80 columns, a long path across lines.
    monkeypatch.chdir(tmp_path)
    places = {
        "missing": "nowhere",
        "profiles": str(traces / "pollux" / "profiles"),
        "empty": ".",
    }
    result = CliRunner().invoke(sim_app, [a.format(**places) for a in argv])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert flag in result.output and "nowhere" in result.output
    assert "Traceback" not in result.output


def test_compare_shows_every_workload_in_the_terminals_units(traces: Path, tmp_path: Path) -> None:
    (tmp_path / "workload-1.csv").write_text(WORKLOAD)
    (tmp_path / "workload-2.csv").write_text(WORKLOAD.replace(",30,", ",600,"))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        sim_app,
        [
            "compare",
            "--workloads",
            str(tmp_path),
            "--profiles",
            str(traces / "pollux" / "profiles"),
            "--policies",
            "static,goodput",
            "--nodes",
            "2",
            "--output-dir",
            str(out),
        ],
        env={"COLUMNS": "120"},
    )
    assert result.exit_code == 0, result.output
    # One summary table per workload, each titled with it.
    assert result.output.count("average JCT") >= 2
    assert result.output.count("makespan") >= 2
    for stem in ("workload-1", "workload-2"):
        assert any(line.strip() == stem for line in result.output.splitlines()), result.output
    table = (out / "comparison.md").read_text()
    assert "| average JCT (s), by workload |" in table
    assert "mean makespan (h)" in table and "mean GPU utilisation (%)" in table
    # The file's makespan is the terminal's: hours, one decimal.
    made = next(line for line in table.splitlines() if "makespan" in line).split("|")[2].strip()
    assert f"{made} h" in result.output
    # gpus_per_job.png has a panel per workload: two side by side, wider than one.
    png = (out / "gpus_per_job.png").read_bytes()
    assert png[:4] == b"\x89PNG" and int.from_bytes(png[16:20], "big") == 800
