"""`tidal run` gives each worker its own GPU: NCCL refuses two ranks on one device."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.launch.run import visible_gpus, worker_slots
from tidal.launch.run_args import UsageProblem


def _driver(tmp_path: Path, gpus: int) -> Path:
    proc = tmp_path / "gpus"
    proc.mkdir()
    for i in range(gpus):
        (proc / f"0000:{i:02x}:00.0").mkdir()
    return proc


def test_the_drivers_gpus_are_visible_when_cuda_visible_devices_is_unset(tmp_path: Path) -> None:
    assert visible_gpus({}, _driver(tmp_path, 2)) == ["0", "1"]


def test_cuda_visible_devices_names_the_gpus(tmp_path: Path) -> None:
    proc = _driver(tmp_path, 4)
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 3"}, proc) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, proc) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, proc) == []


def test_no_driver_means_no_gpu(tmp_path: Path) -> None:
    assert visible_gpus({}, tmp_path / "absent") == []


def test_each_worker_gets_its_own_gpu() -> None:
    assert worker_slots(2, ["2", "3"]) == ["local:2", "local:3"]
    assert worker_slots(1, ["2", "3"]) == ["local:2"]


def test_cpu_slots_without_gpus() -> None:
    assert worker_slots(3, []) == ["local:0", "local:1", "local:2"]


def test_more_workers_than_gpus_is_refused_naming_the_argument() -> None:
    with pytest.raises(
        UsageProblem, match=r"--workers: at most 1 worker\(s\) here.*TIDAL_BACKEND=gloo"
    ):
        worker_slots(2, ["0"])
