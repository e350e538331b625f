"""Shared placement rules."""

from __future__ import annotations

from tidal.policy.api import Cluster, Host, JobRequest
from tidal.policy.packing import place_packed
from tidal.policy.placement import place

CLUSTER = Cluster((Host("h0", 4), Host("h1", 4), Host("h2", 2)))


def jobs(*names: str, group: str | None = None) -> dict[str, JobRequest]:
    return {n: JobRequest(n, 1, 8, group=group) for n in names}


def test_growing_job_keeps_its_slots_and_fills_its_hosts_first() -> None:
    held = {"a": (("h1", 2),)}
    alloc = place({"a": 3}, jobs("a"), CLUSTER, held)
    assert alloc["a"] == (("h1", 0), ("h1", 1), ("h1", 2))


def test_best_fit_host_for_a_small_job() -> None:
    alloc = place({"a": 2}, jobs("a"), CLUSTER, {})
    assert alloc["a"] == (("h2", 0), ("h2", 1))


def test_large_job_uses_fewest_hosts() -> None:
    alloc = place({"a": 8}, jobs("a"), CLUSTER, {})
    assert {host for host, _ in alloc["a"]} == {"h0", "h1"}


def test_stale_or_duplicate_slots_are_not_kept() -> None:
    held = {"a": (("gone", 0), ("h0", 0)), "b": (("h0", 0), ("h0", 9))}
    alloc = place({"a": 1, "b": 2}, jobs("a", "b"), CLUSTER, held)
    assert alloc["a"] == (("h0", 0),)
    assert ("h0", 0) not in alloc["b"] and len(alloc["b"]) == 2


def test_grouped_job_evicts_ungrouped_job_from_its_hosts() -> None:
    cluster = Cluster((Host("g0", 2, group="gpu-a"), Host("x0", 2)))
    requests = {**jobs("free"), **jobs("grouped", group="gpu-a")}
    held = {"free": (("g0", 0), ("g0", 1))}
    alloc = place({"free": 2, "grouped": 2}, requests, cluster, held)
    assert {host for host, _ in alloc["grouped"]} == {"g0"}
    assert {host for host, _ in alloc["free"]} == {"x0"}


def test_packed_placement_moves_a_resized_job_onto_whole_hosts() -> None:
    cluster = Cluster(tuple(Host(f"h{i}", 4) for i in range(3)))
    held = {"a": (("h0", 0), ("h1", 0)), "b": (("h2", 0),)}
    alloc = place_packed({"a": 4, "b": 1}, jobs("a", "b"), cluster, held)
    # "b" keeps its slot; "a" is resized, so it takes a whole free host instead of growing.
    assert alloc["b"] == (("h2", 0),)
    assert len({host for host, _ in alloc["a"]}) == 1


def test_packed_placement_keeps_an_unchanged_packed_job_and_repacks_a_spread_one() -> None:
    cluster = Cluster(tuple(Host(f"h{i}", 4) for i in range(3)))
    held = {"a": (("h0", 0), ("h0", 1)), "b": (("h1", 0), ("h2", 0))}
    alloc = place_packed({"a": 2, "b": 2}, jobs("a", "b"), cluster, held)
    assert alloc["a"] == held["a"]
    assert len({host for host, _ in alloc["b"]}) == 1


def test_packed_placement_falls_back_when_free_slots_are_fragmented() -> None:
    cluster = Cluster(tuple(Host(f"h{i}", 4) for i in range(2)))
    held = {"x": (("h0", 0), ("h0", 1), ("h0", 2)), "y": (("h1", 0), ("h1", 1), ("h1", 2))}
    alloc = place_packed({"x": 3, "y": 3, "a": 2}, jobs("x", "y", "a"), cluster, held)
    assert alloc["x"] == held["x"] and alloc["y"] == held["y"]
    assert sorted(alloc["a"]) == [("h0", 3), ("h1", 3)]


def test_packed_placement_resizes_in_place_when_that_stays_packed() -> None:
    # One 4-slot host, 2 + 2 becoming 1 + 3: the shrinking job keeps one of its own slots
    # and the growing one adds the freed slot, so neither needs a slot the other still
    # holds (a live job would wait for it, and the other for this one's).
    cluster = Cluster((Host("local", 4),))
    held = {"a": (("local", 0), ("local", 1)), "b": (("local", 2), ("local", 3))}
    alloc = place_packed({"a": 1, "b": 3}, jobs("a", "b"), cluster, held)
    assert set(alloc["a"]) < set(held["a"])
    assert set(alloc["b"]) > set(held["b"])


def test_packed_placement_grows_on_its_own_host_and_shrinks_within_its_hosts() -> None:
    cluster = Cluster(tuple(Host(f"h{i}", 4) for i in range(3)))
    held = {
        "grows": (("h1", 0), ("h1", 1)),
        "shrinks": (("h0", 0), ("h0", 1), ("h0", 2), ("h0", 3), ("h2", 0), ("h2", 1)),
    }
    alloc = place_packed({"grows": 4, "shrinks": 4}, jobs("grows", "shrinks"), cluster, held)
    assert set(alloc["grows"]) > set(held["grows"]) and {h for h, _ in alloc["grows"]} == {"h1"}
    # The host it held fewest slots on is the one it gives up.
    assert set(alloc["shrinks"]) == {("h0", i) for i in range(4)}


def test_packed_placement_moves_a_job_whose_own_hosts_have_no_room() -> None:
    cluster = Cluster(tuple(Host(f"h{i}", 4) for i in range(2)))
    held = {"a": (("h0", 0), ("h0", 1)), "b": (("h0", 2), ("h0", 3))}
    alloc = place_packed({"a": 4, "b": 2}, jobs("a", "b"), cluster, held)
    assert alloc["b"] == held["b"]
    assert {h for h, _ in alloc["a"]} == {"h1"}
