"""Resource groups from the server's config: the slot formula's grammar (no eval), the
config's checks naming the field, hosts grouped by name or label with slots computed from
what each reports, and ``tidal server --config`` serving the groups it says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.controller.live import start_server, stop_server
from tidal.client import Client
from tidal.controller.cluster import ClusterHost
from tidal.controller.resource_groups import (
    ClusterConfig,
    ClusterConfigError,
    apply_groups,
    evaluate_slots,
    load_cluster_config,
    parse_slots,
)


def _slots(formula: str, ngpus: int = 8, ncpus: int = 64) -> int:
    return evaluate_slots(parse_slots(formula), {"ngpus": ngpus, "ncpus": ncpus})


def test_a_formula_of_what_the_host_reports() -> None:
    assert _slots("ngpus") == 8
    assert _slots("ncpus // 2") == 32
    assert _slots("min(ngpus, 4) + 1") == 5
    assert _slots("max(ncpus - 60, 0) * 2") == 8
    assert _slots("(ncpus - 2) // 4") == 15
    assert _slots("ngpus - 10") == 0  # never below zero
    assert _slots("ncpus // ngpus", ngpus=0) == 0  # nothing to divide by: no slots


@pytest.mark.parametrize(
    ("formula", "says"),
    [
        ("ngpu", "unknown name 'ngpu'"),
        ("__import__('os').system('true')", "the only functions are min and max"),
        ("ncpus ** 100", "only + - * // are allowed"),
        ("ncpus / 2", "only + - * // are allowed"),
        ("ncpus.real", "not allowed in a formula"),
        ("1.5 * ngpus", "whole"),
        ("ngpus if ncpus else 1", "not allowed in a formula"),
        ("ncpus //", "not a formula"),
        ("min(ngpus)", "two or more"),
    ],
)
def test_anything_else_is_refused_without_being_run(formula: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_slots(formula)


HOSTS = (
    ClusterHost("gpu-1", 8, gpu=True, labels={"gpu": "a100"}, cpus=64),
    ClusterHost("gpu-2", 4, gpu=True, labels={"gpu": "t4"}, cpus=32),
    ClusterHost("build-1", 16, cpus=16),
    ClusterHost("other", 2, cpus=2),
)


def test_hosts_are_grouped_by_label_or_name_with_their_own_slots() -> None:
    config = ClusterConfig.model_validate(
        {
            "groups": [
                {"name": "a100", "labels": {"gpu": "a100"}, "slots": "ngpus"},
                {"name": "cpu", "hosts": ["build-*"], "slots": "ncpus // 2"},
                {"name": "t4", "hosts": ["gpu-2"], "slots": "ngpus // 2"},
            ]
        }
    )
    grouped = {h.name: (h.group, h.slots) for h in apply_groups(HOSTS, config)}
    assert grouped == {
        "gpu-1": ("a100", 8),
        "gpu-2": ("t4", 2),
        "build-1": ("cpu", 8),
        "other": (None, 2),  # in no group: as its backend said
    }


def test_a_group_without_hosts_or_labels_takes_the_rest() -> None:
    config = ClusterConfig.model_validate(
        {"groups": [{"name": "a100", "labels": {"gpu": "a100"}}, {"name": "rest"}]}
    )
    grouped = {h.name: (h.group, h.slots) for h in apply_groups(HOSTS, config)}
    assert grouped["gpu-1"] == ("a100", 8)
    assert grouped["other"] == ("rest", 2)


def test_a_bad_config_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "groups:\n"
        "  - name: a\n    slots: ngpu\n"
        "  - name: b\n    labels: {ib: yes}\n"
        "  - name: a\n"
        "surprise: 1\n"
    )
    with pytest.raises(ClusterConfigError) as refused:
        load_cluster_config(path)
    paths = [p for p, _ in refused.value.problems]
    assert "groups.0.slots" in paths
    assert "groups.1.labels.ib" in paths
    assert "surprise" in paths
    path.write_text("groups:\n  - name: a\n  - name: a\n")
    with pytest.raises(ClusterConfigError, match=r"groups: .*repeated: a"):
        load_cluster_config(path)


def test_the_server_refuses_a_bad_config_naming_flag_and_field(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("groups:\n  - name: a\n    slots: ncpus ** 2\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tidal.cli",
            "server",
            "--config",
            str(path),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TIDAL_HOME": str(tmp_path / "home")},
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    said = " ".join((done.stdout + done.stderr).split())
    assert "--config" in said and "groups.0.slots" in said and "only + - * //" in said
    assert not any(tmp_path.rglob("*.db"))  # refused before any store was made


@pytest.mark.slow
def test_the_server_serves_the_groups_of_its_config(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("groups:\n  - name: cpu\n    labels: {pool: cpu}\n    slots: ncpus * 3\n")
    process = start_server(tmp_path, "--config", str(path), "--label", "pool=cpu", slots=1)
    try:
        with Client(data_dir=tmp_path / "data", timeout=30) as client:
            hosts = client.cluster().hosts
            ncpus = len(os.sched_getaffinity(0))
            assert [(h.group, h.slots) for h in hosts] == [("cpu", 3 * ncpus)]
            job = client.submit(
                {"name": "grouped", "command": ["/bin/true"], "target": {"group": "cpu"}}
            )
            assert job.id
    finally:
        stop_server(process)
