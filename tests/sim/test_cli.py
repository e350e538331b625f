"""``tidal sim`` commands end to end on a tiny workload."""

from __future__ import annotations

import json
from pathlib import Path

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
