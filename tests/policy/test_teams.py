"""Team queues: guarantees met, limits kept, loans reclaimed first, one team = the inner."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.policy.api import Allocation, Cluster, Host, JobRequest
from tidal.policy.budget import slot_cap
from tidal.policy.fairshare import FairSharePolicy
from tidal.policy.goodput import live_policy
from tidal.policy.team_queues import TeamQueues, decide
from tidal.policy.teams import Team, TeamQuotaError, check_quotas, team_shares

from .strategies import assert_valid, clusters

NAMES = ("a", "b", "c")
EIGHT = Cluster((Host("h0", 4), Host("h1", 4)))


@st.composite
def team_lists(draw: st.DrawFn, total: int) -> list[Team]:
    """One to three teams whose guarantees fit ``total`` slots."""
    count = draw(st.integers(1, len(NAMES)))
    teams: list[Team] = []
    left = total
    for name in NAMES[:count]:
        guaranteed = draw(st.integers(0, left))
        left -= guaranteed
        teams.append(
            Team(
                name,
                weight=draw(st.sampled_from([0.5, 1.0, 2.0])),
                guaranteed={None: guaranteed},
                borrowing_limit=draw(st.one_of(st.none(), st.integers(0, total))),
                hard_limit=draw(st.one_of(st.none(), st.integers(0, total))),
            )
        )
    return teams


@st.composite
def team_jobs(draw: st.DrawFn, teams: list[Team], first: int = 0) -> list[JobRequest]:
    """Up to six elastic jobs (minimum one slot, so any share can be used) of ``teams``."""
    jobs = []
    for i in range(first, first + draw(st.integers(0, 6))):
        high = draw(st.integers(1, 10))
        jobs.append(
            JobRequest(
                job_id=f"j{i}",
                min_slots=1,
                max_slots=high,
                priority=draw(st.sampled_from([1000, 5000])),
                submitted_at=float(i),
                team=draw(st.sampled_from([t.name for t in teams])),
            )
        )
    return jobs


@st.composite
def scenes(draw: st.DrawFn) -> tuple[Cluster, list[Team], list[JobRequest], list[JobRequest]]:
    """A cluster, its teams, the jobs running first and the jobs submitted after."""
    cluster = draw(clusters())
    teams = draw(team_lists(cluster.total_slots))
    first = draw(team_jobs(teams))
    later = draw(team_jobs(teams, first=len(first)))
    return cluster, teams, first, later


@st.composite
def reclaim_scenes(
    draw: st.DrawFn,
) -> tuple[Cluster, list[Team], list[JobRequest], list[JobRequest]]:
    """A scene whose later jobs are of teams with a guarantee, which may take it back."""
    cluster = draw(clusters())
    teams = draw(team_lists(cluster.total_slots))
    first = draw(team_jobs(teams))
    takers = [t for t in teams if t.guarantee(None)] or teams
    return cluster, teams, first, draw(team_jobs(takers, first=len(first)))


def used(allocation: Allocation, jobs: list[JobRequest], team: str) -> int:
    return sum(len(allocation.get(j.job_id, ())) for j in jobs if j.team == team)


def demanded(jobs: list[JobRequest], team: Team) -> int:
    wanted = sum(slot_cap(j) for j in jobs if j.team == team.name)
    cap = team.cap()
    return wanted if cap is None else min(wanted, cap)


@settings(max_examples=150, deadline=None)
@given(scenes())
def test_guarantees_met_and_limits_kept(
    scene: tuple[Cluster, list[Team], list[JobRequest], list[JobRequest]],
) -> None:
    cluster, teams, first, later = scene
    policy = TeamQueues(FairSharePolicy(), teams)
    before = policy.allocate(first, cluster, {})
    jobs = first + later
    after = policy.allocate(jobs, cluster, before)
    assert_valid(after, cluster)
    for team in teams:
        got = used(after, jobs, team.name)
        assert got >= min(team.guarantee(None), demanded(jobs, team)), team
        cap = team.cap()
        assert cap is None or got <= cap, team
    # Slots stay idle only when no team can use more.
    total = sum(len(s) for s in after.values())
    assert total == min(cluster.total_slots, sum(demanded(jobs, t) for t in teams))


@settings(max_examples=150, deadline=None)
@given(scenes())
def test_loans_reclaimed_before_a_team_within_its_guarantee_is_touched(
    scene: tuple[Cluster, list[Team], list[JobRequest], list[JobRequest]],
) -> None:
    cluster, teams, first, later = scene
    policy = TeamQueues(FairSharePolicy(), teams)
    before = policy.allocate(first, cluster, {})
    jobs = first + later
    after = policy.allocate(jobs, cluster, before)
    for team in teams:
        unchanged = not any(j.team == team.name for j in later)
        held = used(before, first, team.name)
        if unchanged and held <= team.guarantee(None):
            # Within its guarantee and asking for nothing new: it keeps every slot.
            assert used(after, jobs, team.name) >= held, team


def loan_slots(allocation: Allocation, jobs: list[JobRequest], teams: list[Team]) -> dict[str, int]:
    """Each job's slots above its team's guarantee: a team's jobs started first hold its
    guarantee, those started after hold its loan."""
    loan: dict[str, int] = {}
    for team in teams:
        mine = sorted((j for j in jobs if j.team == team.name), key=lambda j: j.started_at or 0)
        count = 0
        for job in mine:
            held = len(allocation.get(job.job_id, ()))
            loan[job.job_id] = count + held - max(count, team.guarantee(None)) if held else 0
            count += held
    return {j: max(0, n) for j, n in loan.items()}


@settings(max_examples=400, deadline=None)
@given(reclaim_scenes(), st.randoms(use_true_random=False))
def test_the_newest_loan_is_reclaimed_first(
    scene: tuple[Cluster, list[Team], list[JobRequest], list[JobRequest]],
    rng: random.Random,
) -> None:
    cluster, teams, first, later = scene
    policy = TeamQueues(FairSharePolicy(), teams)
    before = policy.allocate(first, cluster, {})
    # The running jobs started in an order of their own, not their submission order.
    order = list(range(len(first)))
    rng.shuffle(order)
    running = [
        replace(j, started_at=float(order[i])) if j.job_id in before else j
        for i, j in enumerate(first)
    ]
    loan = loan_slots(before, running, teams)
    after = policy.allocate(running + later, cluster, before)
    jobs = running + later
    takers = [
        t
        for t in teams
        if used(before, running, t.name) < t.guarantee(None)
        and used(after, jobs, t.name) > used(before, running, t.name)
    ]
    if not takers:
        return  # no guarantee taken back: no reclaim
    shrunk = {t.name for t in teams if used(after, jobs, t.name) < used(before, running, t.name)}
    left = loan_slots(after, running, teams)
    for x in running:
        if x.team not in shrunk or not loan[x.job_id]:
            continue
        if len(after.get(x.job_id, ())) >= len(before[x.job_id]):
            continue
        for y in running:
            newer = loan[y.job_id] and (y.started_at or 0) > (x.started_at or 0)
            above_min = min(left[y.job_id], len(after.get(y.job_id, ())) - y.min_slots)
            # An older loan gave a slot back while a newer one keeps some above its minimum.
            assert not (newer and above_min > 0), (x.job_id, y.job_id)


@settings(max_examples=100, deadline=None)
@given(scenes())
def test_deterministic(
    scene: tuple[Cluster, list[Team], list[JobRequest], list[JobRequest]],
) -> None:
    cluster, teams, first, later = scene
    before = TeamQueues(FairSharePolicy(), teams).allocate(first, cluster, {})
    jobs = first + later
    one = decide(FairSharePolicy(), teams, jobs, cluster, before)
    two = decide(FairSharePolicy(), teams, jobs, cluster, before)
    assert one == two


@settings(max_examples=100, deadline=None)
@given(clusters(), st.data())
def test_one_team_answers_as_the_inner_policy(cluster: Cluster, data: st.DataObject) -> None:
    team = Team(
        "a",
        guaranteed={None: data.draw(st.integers(0, cluster.total_slots))},
        hard_limit=data.draw(st.one_of(st.none(), st.just(cluster.total_slots))),
    )
    first = data.draw(team_jobs([team]))
    later = data.draw(team_jobs([team], first=len(first)))
    for inner in (FairSharePolicy, live_policy):
        before = inner().allocate(first, cluster, {})
        wrapped = TeamQueues(inner(), [team]).allocate(first + later, cluster, before)
        assert wrapped == inner().allocate(first + later, cluster, before)


def test_the_reclaim_scene() -> None:
    """A borrows all 8; B submits and gets its 4 back from A's job, which shrinks to 4
    (not preempted); B ends and A grows back to 8. Both sides say why."""
    teams = [Team("a", guaranteed={None: 4}), Team("b", guaranteed={None: 4})]
    policy = TeamQueues(FairSharePolicy(), teams)
    a = JobRequest("a1", 1, 8, team="a", submitted_at=0.0)
    b = JobRequest("b1", 4, 4, team="b", submitted_at=1.0)
    alone = policy.allocate([a], EIGHT, {})
    assert len(alone["a1"]) == 8
    assert policy.last is not None
    assert [(n.job_id, n.message) for n in policy.last.notes] == [
        ("a1", "lent to team a by team b")
    ]
    usage = {u.team: u for u in policy.last.usage}
    assert (usage["a"].borrowed, usage["b"].lent) == (4, 4)
    shared = policy.allocate([a, b], EIGHT, alone)
    assert (len(shared["a1"]), len(shared["b1"])) == (4, 4)
    assert set(shared["a1"]) < set(alone["a1"])  # shrunk in place, not moved
    assert [(n.job_id, n.message) for n in policy.last.notes] == [
        ("a1", "4 slot(s) reclaimed by team b"),
        ("b1", "reclaimed by team b from team a"),
    ]
    back = policy.allocate([a], EIGHT, {"a1": shared["a1"]})
    assert len(back["a1"]) == 8


def test_three_teams_the_newest_loan_goes_back_first() -> None:
    """a borrows 8 of 12, b the 4 left after it; c takes its guarantee of 8 back: b's loan,
    the newer, shrinks to its minimum before a's gives a slot (not 2 and 2 by weight)."""
    twelve = Cluster((Host("h0", 4), Host("h1", 4), Host("h2", 4)))
    teams = [Team("a"), Team("b"), Team("c", guaranteed={None: 8})]
    policy = TeamQueues(FairSharePolicy(), teams)
    a = JobRequest("a1", 1, 8, team="a", submitted_at=0.0)
    b = JobRequest("b1", 1, 4, team="b", submitted_at=1.0)
    alone = policy.allocate([a], twelve, {})
    a = replace(a, started_at=0.0)
    both = policy.allocate([a, b], twelve, alone)
    assert (len(both["a1"]), len(both["b1"])) == (8, 4)
    b = replace(b, started_at=10.0)
    c = JobRequest("c1", 8, 8, team="c", submitted_at=20.0)
    after = policy.allocate([a, b, c], twelve, both)
    assert {j: len(s) for j, s in after.items()} == {"a1": 3, "b1": 1, "c1": 8}
    assert policy.last is not None
    assert [(n.job_id, n.message) for n in policy.last.notes] == [
        ("a1", "5 slot(s) reclaimed by team c"),
        ("b1", "3 slot(s) reclaimed by team c"),
        ("c1", "reclaimed by team c from team a, b"),
    ]


def test_within_a_team_the_newest_job_gives_back_first() -> None:
    teams = [Team("a"), Team("b", guaranteed={None: 4})]
    policy = TeamQueues(FairSharePolicy(), teams)
    a = [JobRequest(f"a{i}", 1, 4, team="a", submitted_at=float(i)) for i in range(2)]
    before = policy.allocate(a, EIGHT, {})
    # a1 was submitted after a0 but started first: its slots are a's older loan.
    a = [replace(a[0], started_at=5.0), replace(a[1], started_at=0.0)]
    b = JobRequest("b1", 4, 4, team="b", submitted_at=9.0)
    after = policy.allocate([*a, b], EIGHT, before)
    assert {j: len(s) for j, s in after.items()} == {"a0": 1, "a1": 3, "b1": 4}


def test_preemption_takes_the_newest_loan_once_every_borrower_is_at_its_minimum() -> None:
    teams = [Team("a"), Team("b"), Team("c", guaranteed={None: 4})]
    policy = TeamQueues(FairSharePolicy(), teams)
    a = JobRequest("a1", 4, 4, team="a", submitted_at=1.0, started_at=1.0)
    b = JobRequest("b1", 4, 4, team="b", submitted_at=0.0, started_at=0.0)
    before = policy.allocate([a, b], EIGHT, {})
    c = JobRequest("c1", 4, 4, team="c", submitted_at=9.0)
    after = policy.allocate([a, b, c], EIGHT, before)
    assert {j: len(s) for j, s in after.items()} == {"b1": 4, "c1": 4}


def test_borrowers_shrink_to_their_minimum_before_any_is_preempted() -> None:
    teams = [Team("a", guaranteed={None: 4}), Team("b", guaranteed={None: 4})]
    policy = TeamQueues(FairSharePolicy(), teams)
    a = [JobRequest(f"a{i}", 2, 4, team="a", submitted_at=float(i)) for i in range(2)]
    before = policy.allocate(a, EIGHT, {})
    assert sorted(len(s) for s in before.values()) == [4, 4]
    b = JobRequest("b1", 4, 4, team="b", submitted_at=5.0)
    after = policy.allocate([*a, b], EIGHT, before)
    assert [len(after[j.job_id]) for j in a] == [2, 2]


def test_an_evicting_team_loses_the_whole_job_instead() -> None:
    teams = [Team("a", guaranteed={None: 4}, reclaim="evict"), Team("b", guaranteed={None: 4})]
    policy = TeamQueues(FairSharePolicy(), teams)
    a = JobRequest("a1", 1, 8, team="a", submitted_at=0.0)
    b = JobRequest("b1", 4, 4, team="b", submitted_at=1.0)
    alone = policy.allocate([a], EIGHT, {})
    evicted = policy.allocate([a, b], EIGHT, alone)
    assert "a1" not in evicted and len(evicted["b1"]) == 4
    assert len(policy.allocate([a, b], EIGHT, evicted)["a1"]) == 4  # requeued, back on 4


def test_weights_share_the_idle_slots() -> None:
    assert team_shares({"a": 0, "b": 0}, {"a": 8, "b": 8}, {"a": 3.0, "b": 1.0}, 8) == {
        "a": 6,
        "b": 2,
    }


def test_quotas_over_the_pool_are_refused_naming_the_teams() -> None:
    teams = [Team("a", guaranteed={None: 6}), Team("b", guaranteed={None: 4})]
    with pytest.raises(TeamQuotaError, match=r"10 slots but the pool has 8: a \(6\), b \(4\)"):
        check_quotas(teams, {None: 8})
    grouped = [Team("a", guaranteed={"v100": 3}), Team("b", guaranteed={"v100": 2})]
    with pytest.raises(TeamQuotaError, match=r"resource group 'v100' has 4: a \(3\), b \(2\)"):
        check_quotas(grouped, {None: 8, "v100": 4})


def test_guarantees_per_resource_group() -> None:
    cluster = Cluster((Host("g0", 4, group="v100"), Host("h0", 4)))
    teams = [Team("a", guaranteed={"v100": 3}), Team("b", guaranteed={"v100": 1})]
    jobs = [
        JobRequest("a1", 1, 8, team="a", group="v100"),
        JobRequest("b1", 1, 8, team="b", group="v100", submitted_at=1.0),
    ]
    answer = TeamQueues(FairSharePolicy(), teams).allocate(jobs, cluster, {})
    assert (len(answer["a1"]), len(answer["b1"])) == (3, 1)
    assert all(host == "g0" for slots in answer.values() for host, _ in slots)


def test_a_pool_that_shrank_below_the_guarantees_is_shared_in_their_proportions() -> None:
    # Guarantees checked against 8 slots at start; a host drained or lost leaves 4.
    teams = [Team("a", guaranteed={None: 6}), Team("b", guaranteed={None: 2})]
    jobs = [
        JobRequest(job_id="a1", min_slots=1, max_slots=8, submitted_at=0.0, team="a"),
        JobRequest(job_id="b1", min_slots=1, max_slots=8, submitted_at=1.0, team="b"),
    ]
    four = Cluster((Host("h1", 4),))
    decision = decide(FairSharePolicy(), teams, jobs, four, {})
    assert {j: len(s) for j, s in decision.allocation.items()} == {"a1": 3, "b1": 1}
    assert_valid(decision.allocation, four)
