"""Spot-aware placement: hosts labelled ``preemptible`` are used last, a job that cannot
shrink stays off them where it can, and an elastic job's slots there are spread."""

from __future__ import annotations

from collections import Counter

from tidal.policy.api import Cluster, Host, JobRequest
from tidal.policy.fairshare import FairSharePolicy
from tidal.policy.placement import place, preemptible

SPOT = {"preemptible": "true"}


def hosts_of(slots: tuple[tuple[str, int], ...]) -> Counter[str]:
    return Counter(h for h, _ in slots)


def test_the_label_is_read_as_a_flag() -> None:
    assert preemptible(Host("a", 1, labels={"preemptible": "true"}))
    assert preemptible(Host("a", 1, labels={"preemptible": "spot"}))
    assert not preemptible(Host("a", 1, labels={"preemptible": "False"}))
    assert not preemptible(Host("a", 1))


def test_a_job_that_cannot_shrink_goes_to_a_host_that_stays() -> None:
    # The spot host comes first and fits exactly: without the label it would be chosen.
    cluster = Cluster((Host("spot", 2, labels=SPOT), Host("stable", 4)))
    jobs = {"fixed": JobRequest("fixed", 2, 2)}
    assert hosts_of(place({"fixed": 2}, jobs, cluster, {})["fixed"]) == {"stable": 2}
    plain = Cluster((Host("spot", 2), Host("stable", 4)))
    assert hosts_of(place({"fixed": 2}, jobs, plain, {})["fixed"]) == {"spot": 2}


def test_an_elastic_job_takes_the_stable_host_first_and_spreads_the_rest() -> None:
    cluster = Cluster((Host("s0", 4, labels=SPOT), Host("s1", 4, labels=SPOT), Host("stable", 2)))
    jobs = {"e": JobRequest("e", 1, 8)}
    slots = place({"e": 6}, jobs, cluster, {})["e"]
    # Both stable slots, then two on each spot host: one preemption costs 2 of 6, not 4.
    assert hosts_of(slots) == {"stable": 2, "s0": 2, "s1": 2}


def test_a_policy_places_through_the_same_rules() -> None:
    cluster = Cluster((Host("spot", 4, labels=SPOT), Host("stable", 4)))
    jobs = [JobRequest("fixed", 4, 4), JobRequest("elastic", 1, 4, submitted_at=1.0)]
    got = FairSharePolicy().allocate(jobs, cluster, {})
    assert hosts_of(got["fixed"]) == {"stable": 4}
    assert hosts_of(got["elastic"]) == {"spot": 4}


def test_slots_a_job_holds_on_a_spot_host_are_kept() -> None:
    cluster = Cluster((Host("spot", 4, labels=SPOT), Host("stable", 4)))
    held = {"e": (("spot", 0), ("spot", 1))}
    slots = place({"e": 3}, {"e": JobRequest("e", 1, 8)}, cluster, held)["e"]
    assert set(held["e"]) <= set(slots) and ("stable", 0) in slots
