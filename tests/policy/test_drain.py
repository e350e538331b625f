"""Draining hosts: the allocation without a leaving host's slots (pure)."""

from __future__ import annotations

from dataclasses import replace

from tidal.policy.api import Cluster, Host, JobRequest
from tidal.policy.drain import CHECKPOINT_LEAD, CheckpointOrder, evacuate
from tidal.policy.fairshare import FairSharePolicy
from tidal.policy.static import StaticPolicy

NOW = 1_000.0


def cluster(*, leaving: str | None = None, at: float | None = None) -> Cluster:
    hosts = tuple(Host(f"h{i}", 4) for i in range(3))
    return Cluster(
        tuple(replace(h, leaving=True, leaves_at=at) if h.name == leaving else h for h in hosts)
    )


def on(host: str, *indices: int) -> tuple[tuple[str, int], ...]:
    return tuple((host, i) for i in indices)


def test_without_leaving_hosts_the_policy_answers_unchanged() -> None:
    jobs = [JobRequest("a", 1, 6)]
    previous = {"a": on("h0", 0, 1, 2, 3) + on("h1", 0, 1)}
    policy = FairSharePolicy()
    decision = evacuate(policy, jobs, cluster(), previous, NOW)
    assert decision.allocation == policy.allocate(jobs, cluster(), previous)
    assert decision.checkpoints == () and decision.staying == ()


def test_an_elastic_job_moves_off_a_leaving_host_and_keeps_the_rest() -> None:
    jobs = [JobRequest("a", 2, 6)]
    previous = {"a": on("h0", 0, 1, 2, 3) + on("h1", 0, 1)}
    decision = evacuate(FairSharePolicy(), jobs, cluster(leaving="h0", at=NOW + 30), previous, NOW)
    slots = decision.allocation["a"]
    assert not any(h == "h0" for h, _ in slots)
    assert set(on("h1", 0, 1)) <= set(slots)  # what it holds elsewhere stays
    assert len(slots) == 6  # it grows on the hosts that stay
    assert decision.checkpoints == ()


def test_a_leaving_host_gets_no_new_workers() -> None:
    jobs = [JobRequest("a", 1, 12), JobRequest("b", 1, 4)]
    decision = evacuate(FairSharePolicy(), jobs, cluster(leaving="h2"), {}, NOW)
    used = {h for slots in decision.allocation.values() for h, _ in slots}
    assert "h2" not in used and used


def test_a_fixed_job_with_no_room_elsewhere_checkpoints_before_the_deadline() -> None:
    jobs = [JobRequest("fixed", 4, 4), JobRequest("big", 8, 8)]
    previous = {"fixed": on("h0", 0, 1, 2, 3), "big": on("h1", 0, 1, 2, 3) + on("h2", 0, 1, 2, 3)}
    deadline = NOW + 120
    leaving = cluster(leaving="h0", at=deadline)
    policy = StaticPolicy()

    early = evacuate(policy, jobs, leaving, previous, NOW)
    # Far from the deadline it trains on where it is, and nobody else is moved.
    assert early.allocation["fixed"] == previous["fixed"]
    assert early.allocation["big"] == previous["big"]
    assert early.staying == ("fixed",)
    order = CheckpointOrder("fixed", "h0", deadline, deadline - CHECKPOINT_LEAD)
    assert early.checkpoints == (order,)

    due = evacuate(policy, jobs, leaving, previous, deadline - CHECKPOINT_LEAD)
    # Then it is given nothing: the backend stops it with a durable checkpoint.
    assert "fixed" not in due.allocation
    assert due.checkpoints == (order,) and due.staying == ()
    assert due.allocation["big"] == previous["big"]


def test_a_thirty_second_notice_checkpoints_at_once() -> None:
    jobs = [JobRequest("fixed", 4, 4), JobRequest("big", 8, 8)]
    previous = {"fixed": on("h0", 0, 1, 2, 3), "big": on("h1", 0, 1, 2, 3) + on("h2", 0, 1, 2, 3)}
    decision = evacuate(StaticPolicy(), jobs, cluster(leaving="h0", at=NOW + 30), previous, NOW)
    assert "fixed" not in decision.allocation
    assert [o.at for o in decision.checkpoints] == [NOW]


def test_a_fixed_job_with_room_elsewhere_moves_without_a_checkpoint() -> None:
    jobs = [JobRequest("fixed", 4, 4)]
    previous = {"fixed": on("h0", 0, 1, 2, 3)}
    decision = evacuate(StaticPolicy(), jobs, cluster(leaving="h0", at=NOW + 30), previous, NOW)
    assert len(decision.allocation["fixed"]) == 4
    assert all(h != "h0" for h, _ in decision.allocation["fixed"])
    assert decision.checkpoints == ()


def test_with_no_deadline_a_stuck_job_stays_and_the_others_are_placed_around_it() -> None:
    # "fixed" holds h0 (leaving) and half of h1; "b" holds h2; "c" waits for 2 slots.
    jobs = [
        JobRequest("fixed", 6, 6),
        JobRequest("b", 4, 4),
        JobRequest("c", 2, 2, submitted_at=1.0),
    ]
    previous = {"fixed": on("h0", 0, 1, 2, 3) + on("h1", 2, 3), "b": on("h2", 0, 1, 2, 3)}
    decision = evacuate(StaticPolicy(), jobs, cluster(leaving="h0"), previous, NOW)
    assert decision.allocation["fixed"] == previous["fixed"]
    assert decision.staying == ("fixed",) and decision.checkpoints == ()
    assert decision.allocation["b"] == previous["b"]
    # The queued job gets the free half of h1, not the slots the staying job holds.
    assert decision.allocation["c"] == on("h1", 0, 1)


def test_a_job_left_below_its_minimum_is_placed_afresh_not_kept_at_an_invalid_size() -> None:
    jobs = [JobRequest("fixed", 4, 4)]
    previous = {"fixed": on("h0", 0, 1) + on("h1", 0, 1)}
    decision = evacuate(StaticPolicy(), jobs, cluster(leaving="h0", at=NOW + 30), previous, NOW)
    assert len(decision.allocation["fixed"]) == 4
    assert all(h != "h0" for h, _ in decision.allocation["fixed"])


def test_the_decision_is_a_function_of_its_input() -> None:
    jobs = [JobRequest("fixed", 4, 4), JobRequest("e", 1, 8)]
    previous = {"fixed": on("h0", 0, 1, 2, 3), "e": on("h1", 0, 1)}
    leaving = cluster(leaving="h0", at=NOW + 90)
    first = evacuate(FairSharePolicy(), jobs, leaving, previous, NOW)
    again = evacuate(FairSharePolicy(), jobs, leaving, previous, NOW)
    assert first == again
