"""Ray's draining nodes as tidal's hosts leaving (the mapping; pure)."""

from __future__ import annotations

from tidal.backends.ray.drain_notices import leaving_hosts


def test_draining_nodes_become_hosts_with_their_deadlines_in_seconds() -> None:
    nodes = {"10.0.0.1-aaaaaaaa": "aaaaaaaa11", "10.0.0.2-bbbbbbbb": "bbbbbbbb22"}
    draining = {"aaaaaaaa11": 1_700_000_030_500, "bbbbbbbb22": 0, "cccccccc33": 5}
    assert leaving_hosts(nodes, draining) == {
        "10.0.0.1-aaaaaaaa": 1_700_000_030.5,
        "10.0.0.2-bbbbbbbb": None,  # Ray's 0: no deadline
    }


def test_no_draining_node_no_host() -> None:
    assert leaving_hosts({"h": "n"}, {}) == {}
