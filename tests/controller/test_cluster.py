"""Cluster model, slot detection and loading policies/backends by name."""

from __future__ import annotations

import pytest

from tidal.controller.cluster import ClusterHost, ClusterModel, detect_local
from tidal.controller.plugins import PluginError, load_backend, load_policy


def test_detect_prefers_explicit_slots_then_gpus_then_cores() -> None:
    explicit = detect_local(3, gpu_count=8, name="h")
    assert (explicit.total_slots, explicit.gpu) == (3, False)
    gpus = detect_local(None, gpu_count=2, name="h")
    assert (gpus.total_slots, gpus.gpu) == (2, True)
    cores = detect_local(None, gpu_count=0, name="h")
    assert cores.total_slots >= 1 and not cores.gpu
    with pytest.raises(ValueError, match="slots must be"):
        detect_local(0)


def test_policy_view_and_placement() -> None:
    cluster = ClusterModel(
        hosts=(
            ClusterHost("a", 4, gpu=True, group="a100", labels={"ib": "yes"}),
            ClusterHost("b", 2, gpu=True),
        )
    )
    view = cluster.to_policy()
    assert view.total_slots == 6
    assert [(h.name, h.group) for h in view.hosts] == [("a", "a100"), ("b", None)]
    assert cluster.can_place("a100", {"ib": "yes"}, 4)
    assert not cluster.can_place("a100", {}, 5)
    assert not cluster.can_place(None, {"ib": "no"}, 1)
    # Why not, named as the user wrote the target.
    assert cluster.shortfall("a100", {"ib": "yes"}, 4) is None
    assert cluster.shortfall("v100", {}, 1) == "no host is in group v100"
    assert cluster.shortfall(None, {"ib": "yes", "nvidia": "t4"}, 1) == (
        "no host has label nvidia=t4"
    )
    assert cluster.shortfall(None, {"ib": "no"}, 1) == "no host has label ib=no"
    assert cluster.shortfall("a100", {}, 5) == "needs 5 slot(s); the hosts that match have 4"
    assert cluster.has_slot(("b", 1)) and not cluster.has_slot(("b", 2))
    with pytest.raises(ValueError, match="unique"):
        ClusterModel(hosts=(ClusterHost("a", 1), ClusterHost("a", 1)))


def test_plugins_by_import_path_and_clear_errors() -> None:
    assert load_policy("tests.controller.fakes:GreedyPolicy").name == "greedy"
    assert load_backend("tests.controller.fakes:FakeBackend").poll() == {}
    with pytest.raises(PluginError, match="unknown policy 'nope'"):
        load_policy("nope")
    with pytest.raises(PluginError, match="cannot load backend"):
        load_backend("tests.controller.fakes:Missing")
