"""whole_replicas: multi-slot replicas stay whole on one host; one-slot jobs see no change."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence

from tidal.controller.plugins import load_policy
from tidal.policy.api import Allocation, Cluster, Host, JobRequest, Policy, Slot
from tidal.policy.fairshare import FairSharePolicy
from tidal.policy.registry import SERVED
from tidal.policy.static import StaticPolicy
from tidal.policy.tiresias import TiresiasPolicy
from tidal.policy.whole_replicas import WholeReplicas, fit_replicas

from .strategies import assert_valid

TWO_BY_FOUR = Cluster((Host("h0", 4), Host("h1", 4)))

#: Fresh instances of the real policies (goodput keeps no state between calls but is
#: built afresh anyway, so no test depends on that).
FACTORIES: list[Callable[[], Policy]] = [
    FairSharePolicy,
    StaticPolicy,
    TiresiasPolicy,
    *[lambda name=name: load_policy(name) for name in SERVED],
]


def slots_of(host: str, *indices: int) -> list[Slot]:
    return [(host, i) for i in indices]


def per_host(slots: Sequence[Slot]) -> dict[str, int]:
    return dict(Counter(name for name, _ in slots))


class Fixed:
    """An inner policy that answers with a fixed allocation (to shape awkward answers)."""

    name = "fixed"

    def __init__(self, answer: dict[str, tuple[Slot, ...]]) -> None:
        self.answer = answer

    def allocate(
        self, jobs: Sequence[JobRequest], cluster: Cluster, previous: Allocation
    ) -> dict[str, tuple[Slot, ...]]:
        return dict(self.answer)


def test_one_slot_jobs_get_exactly_the_inner_answer() -> None:
    cluster = Cluster((Host("h0", 4), Host("h1", 8, group="g"), Host("h2", 2)))
    scenarios = [
        ([JobRequest("a", 1, 8), JobRequest("b", 2, 6, submitted_at=1)], {}),
        (
            [JobRequest(f"j{i}", 1 + i % 3, 9, group="g" if i == 2 else None) for i in range(5)],
            {"j0": (("h0", 0), ("h1", 3)), "j1": (("h2", 0),)},
        ),
        ([JobRequest("big", 14, 14, priority=9000), JobRequest("s", 1, 1)], {}),
    ]
    for factory in FACTORIES:
        for jobs, previous in scenarios:
            wrapped = WholeReplicas(factory())
            assert wrapped.name == factory().name
            assert wrapped.allocate(jobs, cluster, previous) == factory().allocate(
                jobs, cluster, previous
            )
    answer: dict[str, tuple[Slot, ...]] = {"a": (("h0", 1),)}
    inner = Fixed(answer)
    inner.allocate = lambda jobs, cluster, previous: answer  # type: ignore[method-assign]
    assert WholeReplicas(inner).allocate([JobRequest("a", 1, 1)], cluster, {}) is answer


def test_fit_keeps_multiples_of_the_replica_size_per_host() -> None:
    job = JobRequest("a", 2, 8, replica_slots=2)
    slots = slots_of("h0", 0, 1, 2) + slots_of("h1", 0, 1, 2, 3) + slots_of("h2", 5)
    assert fit_replicas(job, slots) == (*slots_of("h0", 0, 1), *slots_of("h1", 0, 1, 2, 3))
    # The job's current slots stay put rather than the lowest indices.
    assert fit_replicas(job, slots, previous=slots_of("h0", 2)) == (
        *slots_of("h0", 0, 2),
        *slots_of("h1", 0, 1, 2, 3),
    )
    # One-slot jobs get their slots back untouched, only sorted.
    assert fit_replicas(JobRequest("b", 1, 9), slots[::-1]) == tuple(sorted(slots))


def test_fit_stops_at_the_maximum_and_prefers_the_roomiest_hosts() -> None:
    job = JobRequest("a", 2, 4, replica_slots=2)
    slots = slots_of("h0", 0, 1) + slots_of("h1", 0, 1, 2, 3)
    assert fit_replicas(job, slots) == tuple(slots_of("h1", 0, 1, 2, 3))


def test_a_two_slot_replica_job_beside_a_one_slot_job_on_hosts_of_four() -> None:
    jobs = [JobRequest("x", 2, 8, replica_slots=2), JobRequest("y", 1, 8, submitted_at=1)]
    for priority in (1000, 3000, 5000, 9000):
        jobs[1] = JobRequest("y", 1, 8, priority=priority, submitted_at=1)
        alloc = WholeReplicas(FairSharePolicy()).allocate(jobs, TWO_BY_FOUR, {})
        assert_valid(alloc, TWO_BY_FOUR)
        assert all(n % 2 == 0 for n in per_host(alloc["x"]).values())
        assert alloc["y"] == FairSharePolicy().allocate(jobs, TWO_BY_FOUR, {})["y"]


def test_three_replicas_of_two_slots_on_two_hosts_of_four() -> None:
    jobs = [JobRequest("x", 6, 6, replica_slots=2), JobRequest("y", 1, 2, submitted_at=1)]
    alloc = WholeReplicas(FairSharePolicy()).allocate(jobs, TWO_BY_FOUR, {})
    assert_valid(alloc, TWO_BY_FOUR)
    assert len(alloc["x"]) == 6
    assert sorted(per_host(alloc["x"]).values()) == [2, 4]
    assert len(alloc["y"]) == 2


def test_a_gang_with_scaling_replicas() -> None:
    # A chief of 2 slots, two parameter servers of 1, and 1..3 workers of 2 slots.
    job = JobRequest("tf", 6, 10, replica_slots=2, gang_slots=(2, 1, 1))
    slots = slots_of("h0", 0, 1, 2, 3) + slots_of("h1", 0, 1, 2, 3)
    # Gang on h0, two workers on h1: 8 slots (a third worker has no room left).
    assert fit_replicas(job, slots) == tuple(slots)
    three = slots + slots_of("h2", 0, 1, 2)
    assert per_host(fit_replicas(job, three)) == {"h0": 4, "h1": 4, "h2": 2}
    # Too little for the gang and one worker.
    assert fit_replicas(job, slots_of("h0", 0, 1, 2) + slots_of("h1", 0, 1)) == ()
    alloc = WholeReplicas(FairSharePolicy()).allocate([job], TWO_BY_FOUR, {})
    assert alloc == {"tf": tuple(slots)}


def test_a_gang_first_fit_would_strand_is_still_placed() -> None:
    # First fit decreasing puts 4 and 3 on different hosts of 6 and the last 3 nowhere;
    # 3+3 on one host and 4 on the other leaves room for a worker of 2.
    job = JobRequest("g", 10, 12, replica_slots=2, gang_slots=(4, 3, 3))
    slots = slots_of("h0", *range(6)) + slots_of("h1", *range(6))
    fitted = fit_replicas(job, slots)
    assert fitted == tuple(slots)
    assert fit_replicas(job, fitted) == fitted


def test_a_minimum_that_cannot_be_packed_gets_nothing() -> None:
    cluster = Cluster((Host("h0", 3), Host("h1", 3)))
    job = JobRequest("big", 4, 8, replica_slots=4)
    assert fit_replicas(job, cluster.slots()) == ()
    other = JobRequest("small", 1, 6, submitted_at=1)
    alloc = WholeReplicas(FairSharePolicy()).allocate([job, other], cluster, {})
    assert "big" not in alloc
    assert_valid(alloc, cluster)


def test_a_split_replica_is_repaired_from_free_slots() -> None:
    job = JobRequest("x", 2, 8, replica_slots=2)
    other = JobRequest("y", 1, 1)
    # The inner policy gives "x" 4 slots, one replica's worth split over h0 and h1, and
    # h1's last slot to "y": the second replica can only go back on h0, whole.
    inner = Fixed({"x": (("h0", 3), *slots_of("h1", 0, 1, 2)), "y": (("h1", 3),)})
    alloc = WholeReplicas(inner).allocate([job, other], TWO_BY_FOUR, {})
    assert alloc == {"x": (*slots_of("h0", 0, 1), *slots_of("h1", 0, 1)), "y": (("h1", 3),)}
    # With room on its own host the lost replica comes back there.
    alone = WholeReplicas(Fixed({"x": inner.answer["x"]})).allocate([job], TWO_BY_FOUR, {})
    assert alone == {"x": tuple(slots_of("h1", 0, 1, 2, 3))}


def test_a_job_whose_slots_hold_no_replica_is_placed_whole_from_free_slots() -> None:
    job = JobRequest("x", 4, 4, replica_slots=4)
    other = JobRequest("y", 1, 1)
    inner = Fixed({"x": (*slots_of("h0", 0, 1), *slots_of("h1", 0, 1)), "y": (("h0", 2),)})
    alloc = WholeReplicas(inner).allocate([job, other], TWO_BY_FOUR, {})
    assert alloc == {"x": tuple(slots_of("h1", 0, 1, 2, 3)), "y": (("h0", 2),)}
    # No host with four free slots: the job gets nothing and nothing breaks.
    inner = Fixed({**inner.answer, "z": (("h1", 3),)})
    last = JobRequest("z", 1, 1)
    alloc = WholeReplicas(inner).allocate([job, other, last], TWO_BY_FOUR, {})
    assert alloc == {"y": (("h0", 2),), "z": (("h1", 3),)}


def test_top_up_never_exceeds_what_the_inner_policy_gave() -> None:
    job = JobRequest("x", 2, 8, replica_slots=2)
    inner = Fixed({"x": (("h0", 0), ("h1", 0), ("h1", 1))})
    alloc = WholeReplicas(inner).allocate([job], TWO_BY_FOUR, {})
    assert alloc == {"x": tuple(slots_of("h1", 0, 1))}


def test_groups_are_respected() -> None:
    cluster = Cluster((Host("a0", 4, group="a"), Host("b0", 4, group="b"), Host("c0", 4)))
    job = JobRequest("x", 2, 4, replica_slots=2, group="b")
    # Slots outside the job's group are dropped and do not count towards its share.
    inner = Fixed({"x": (*slots_of("a0", 0, 1), *slots_of("b0", 0, 1, 2))})
    alloc = WholeReplicas(inner).allocate([job], cluster, {})
    assert alloc == {"x": tuple(slots_of("b0", 0, 1))}
    # Topping up stays in the group too, although c0 is free and would fit.
    inner = Fixed({"x": (*slots_of("b0", 0), *slots_of("c0", 0, 1, 2))})
    assert WholeReplicas(inner).allocate([job], cluster, {}) == {}


def random_scenario(
    rng: random.Random,
) -> tuple[list[JobRequest], Cluster, dict[str, tuple[Slot, ...]]]:
    hosts = tuple(
        Host(f"h{i}", rng.choice([1, 2, 3, 4, 4, 8]), group=rng.choice([None, None, "g"]))
        for i in range(rng.randint(1, 5))
    )
    cluster = Cluster(hosts)
    jobs = []
    for i in range(rng.randint(1, 6)):
        size = rng.choice([1, 1, 2, 2, 3, 4])
        gang = rng.choice([(), (), (1,), (2, 1, 1), (2,), (3, 1), (4, 3, 3)])
        low = rng.randint(0 if gang else 1, 2)
        high = low + rng.randint(0, 4)
        target = rng.choice([None, None, sum(gang) + rng.randint(low, high) * size])
        jobs.append(
            JobRequest(
                f"j{i}",
                sum(gang) + low * size,
                sum(gang) + high * size,
                priority=rng.choice([1000, 5000, 9000]),
                submitted_at=float(rng.randint(0, 5)),
                group=rng.choice([None, None, None, "g"]),
                attained_service=rng.choice([0.0, 5000.0, 50000.0]),
                target_slots=target,
                replica_slots=size,
                gang_slots=gang,
            )
        )
    previous: dict[str, list[Slot]] = {}
    for slot in cluster.slots():
        owner = rng.choice([None, *[j.job_id for j in jobs]])
        if owner is not None:
            previous.setdefault(owner, []).append(slot)
    return jobs, cluster, {j: tuple(s) for j, s in previous.items()}


def test_random_scenarios_give_valid_whole_replica_answers() -> None:
    rng = random.Random(20240611)
    for case in range(300):
        jobs, cluster, previous = random_scenario(rng)
        factory = FACTORIES[case % len(FACTORIES)]
        alloc = WholeReplicas(factory()).allocate(jobs, cluster, previous)
        inner = factory().allocate(jobs, cluster, previous)
        assert WholeReplicas(factory()).allocate(jobs, cluster, previous) == alloc, case
        assert_valid(alloc, cluster)
        groups = {h.name: h.group for h in cluster.hosts}
        by_id = {j.job_id: j for j in jobs}
        for job_id, slots in alloc.items():
            job = by_id[job_id]
            assert slots, case
            if job.one_slot_replicas:
                assert slots == inner[job_id], case
                continue
            assert job.min_slots <= len(slots) <= job.max_slots, case
            assert len(slots) <= len(inner.get(job_id, ())), case
            assert job.group is None or all(groups[h] == job.group for h, _ in slots), case
            assert fit_replicas(job, slots) == slots, case
            if not job.gang_slots:
                assert all(n % job.replica_slots == 0 for n in per_host(slots).values()), case


def test_a_big_gang_on_many_mixed_hosts_falls_back_to_first_fit() -> None:
    rng = random.Random(1)
    cluster = Cluster(tuple(Host(f"h{i}", rng.randint(1, 8)) for i in range(64)))
    gang = (5, 4, 3, 3, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1)
    job = JobRequest("big", sum(gang) + 3, sum(gang) + 600, replica_slots=3, gang_slots=gang)
    fitted = fit_replicas(job, cluster.slots())
    assert job.min_slots <= len(fitted) <= job.max_slots
    assert (len(fitted) - sum(gang)) % 3 == 0
