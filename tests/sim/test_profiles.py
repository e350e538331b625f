"""Profiles reproduce their measurements and interpolate between them."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import pytest

from tidal.sim.profiles import ModelProfile, canonical_placement


def rows(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_measured_placements_are_returned_exactly(
    traces: Path, profiles: dict[str, ModelProfile]
) -> None:
    for name, profile in profiles.items():
        for row in rows(traces / "pollux" / "profiles" / name / "placements.csv"):
            placement = tuple(int(d) for d in row["placement"])
            got = profile.step_time(placement, float(row["local_bsz"]))
            assert got == (float(row["step_time"]), float(row["sync_time"]))


def test_measured_large_configurations_are_returned_exactly(
    traces: Path, profiles: dict[str, ModelProfile]
) -> None:
    for name, profile in profiles.items():
        measured: dict[tuple[int, int, float], list[tuple[float, float]]] = defaultdict(list)
        for row in rows(traces / "pollux" / "profiles" / name / "scalability.csv"):
            key = (int(row["num_nodes"]), int(row["num_replicas"]), float(row["local_bsz"]))
            measured[key].append((float(row["step_time"]), float(row["sync_time"])))
        for (nodes, workers, local), values in measured.items():
            placement = tuple(
                workers // nodes + (1 if i < workers % nodes else 0) for i in range(nodes)
            )
            step = sum(v[0] for v in values) / len(values)
            sync = sum(v[1] for v in values) / len(values)
            assert profile.step_time(placement, local) == pytest.approx((step, sync), rel=1e-12)


def test_unmeasured_batch_is_interpolated_between_neighbours(
    profiles: dict[str, ModelProfile],
) -> None:
    cifar = profiles["cifar10"]
    low, high = cifar.step_time((4,), 32.0)[0], cifar.step_time((4,), 45.0)[0]
    between = cifar.step_time((4,), 38.5)[0]
    assert min(low, high) < between < max(low, high)
    assert between == pytest.approx((low + high) / 2)


def test_unmeasured_node_count_lies_between_measured_ones(
    profiles: dict[str, ModelProfile],
) -> None:
    imagenet = profiles["imagenet"]
    five = imagenet.step_time((4, 4, 4, 4, 4), 100.0)[0]
    four = imagenet.step_time((4, 4, 4, 4), 100.0)[0]
    six = imagenet.step_time((4, 4, 4, 4, 4, 4), 100.0)[0]
    assert min(four, six) <= five <= max(four, six)


def test_canonical_placement_is_the_smallest_rotation() -> None:
    assert canonical_placement((2, 0, 1, 2)) == (1, 2, 2)
    assert canonical_placement((0, 0)) == ()


def test_epochs_and_limits_come_from_the_profiles(profiles: dict[str, ModelProfile]) -> None:
    assert {n: p.epochs for n, p in profiles.items()} == {
        "bert": 2,
        "cifar10": 100,
        "deepspeech2": 80,
        "imagenet": 90,
        "ncf": 10,
        "yolov3": 50,
    }
    assert profiles["yolov3"].max_local_batch == 8
    assert profiles["cifar10"].init_batch == 128 and profiles["cifar10"].max_batch == 4096
