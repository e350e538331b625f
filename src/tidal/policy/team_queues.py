"""Team queues: any policy, run hierarchically over teams with guaranteed quotas.

:class:`TeamQueues` wraps any policy (in the style of
:class:`~tidal.policy.whole_replicas.WholeReplicas`). Pool by pool (each resource group,
then the jobs without one on what the groups leave), :func:`~tidal.policy.loan_order.pool_shares`
decides how many slots each team gets (guarantees first, loans kept, the newest loan taken
back first); each team is then carved its slots (those its jobs hold first, the jobs
started first before the others) and the inner policy shares them among the team's jobs
as it would a cluster of those slots. A team that gives slots back has each job held to
what it keeps (:func:`~tidal.policy.loan_order.kept_sizes`: its newest job shrinks
first, every job to its minimum before any is preempted) and starts no new job then.

Every decision also says why for both sides of a loan (:class:`TeamNote`): "lent to team
A by team B" on a job that grows into borrowed slots, "reclaimed by team B" on a
borrower's job that shrinks, "reclaimed by team B from team A" on the job that gets them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tidal.policy.api import Allocation, Cluster, Host, JobRequest, Policy, Slot
from tidal.policy.budget import slot_cap
from tidal.policy.loan_order import Holding, holding, kept_sizes, pool_shares
from tidal.policy.teams import Team, TeamUsage, fit_quotas, loans

__all__ = ["TeamDecision", "TeamNote", "TeamQueues", "decide", "pool_capacity"]


@dataclass(frozen=True)
class TeamNote:
    """Why a job's slots changed between teams: ``kind`` is ``lent`` or ``reclaimed``."""

    job_id: str
    kind: str
    message: str


@dataclass(frozen=True)
class TeamDecision:
    """A hierarchical decision: the allocation, each team's standing, and the reasons."""

    allocation: dict[str, tuple[Slot, ...]]
    usage: tuple[TeamUsage, ...]
    notes: tuple[TeamNote, ...]


def pool_capacity(cluster: Cluster) -> dict[str | None, int]:
    """Slots of each resource group, and of the whole cluster under ``None``."""
    capacity: dict[str | None, int] = {None: cluster.total_slots}
    for host in cluster.hosts:
        if host.group is not None:
            capacity[host.group] = capacity.get(host.group, 0) + host.slots
    return capacity


@dataclass
class _Pool:
    """One pool's figures per team, kept for the usage and the notes."""

    guarantee: dict[str, int]
    before: dict[str, int]
    after: dict[str, int]
    slots: int


def decide(
    inner: Policy,
    teams: Sequence[Team],
    jobs: Sequence[JobRequest],
    cluster: Cluster,
    previous: Allocation,
) -> TeamDecision:
    """Share ``cluster`` over teams, then over each team's jobs by ``inner``.

    A job of a team not in ``teams`` queues in a team of that name with no guarantee, weight
    1 and no limit. Guarantees that add up to more than a pool now holds (hosts drained or
    lost since they were checked) are cut in proportion (:func:`fit_quotas`).
    """
    teams = fit_quotas(teams, pool_capacity(cluster))
    known = {t.name: t for t in teams}
    for job in jobs:
        known.setdefault(job.team, Team(job.team))
    job_teams = {j.team for j in jobs}
    lone = next(iter(job_teams)) if len(job_teams) == 1 else None
    pools = sorted({j.group for j in jobs if j.group is not None})
    if lone is not None and _unbounded(known[lone], cluster):
        # One team with room for the whole cluster: the hierarchy adds nothing.
        allocation = dict(inner.allocate(jobs, cluster, previous))
    else:
        allocation = {}
        taken: set[Slot] = set()
        room = {name: t.cap() for name, t in known.items()}
        team_of = {j.job_id: j.team for j in jobs}
        for pool in [*pools, None]:
            members = [j for j in jobs if j.group == pool]
            free = [
                s
                for h in cluster.hosts
                if pool is None or h.group == pool
                for s in ((h.name, i) for i in range(h.slots))
                if s not in taken
            ]
            answer = _share_pool(inner, known, members, free, cluster, previous, room, pool)
            for job_id, slots in answer.items():
                allocation[job_id] = slots
                taken.update(slots)
                limit = room[team_of[job_id]]
                if limit is not None:
                    room[team_of[job_id]] = limit - len(slots)
    figures = _pool_figures(known, jobs, cluster, previous, allocation, pools)
    return TeamDecision(
        allocation=allocation,
        usage=_usage(known, figures),
        notes=tuple(_notes(jobs, previous, allocation, figures)),
    )


def _unbounded(team: Team, cluster: Cluster) -> bool:
    """Whether ``team``'s limits leave it the whole cluster."""
    cap = team.cap()
    return cap is None or cap >= cluster.total_slots


def _share_pool(
    inner: Policy,
    known: Mapping[str, Team],
    members: Sequence[JobRequest],
    free: Sequence[Slot],
    cluster: Cluster,
    previous: Allocation,
    room: Mapping[str, int | None],
    pool: str | None,
) -> dict[str, tuple[Slot, ...]]:
    """One pool's slots (``free``) over its teams, then over each team's jobs."""
    by_team: dict[str, list[JobRequest]] = {}
    for job in members:
        by_team.setdefault(job.team, []).append(job)
    demand: dict[str, int] = {}
    for name, team_jobs in by_team.items():
        wanted = sum(slot_cap(j) for j in team_jobs)
        limit = room[name]
        demand[name] = wanted if limit is None else max(0, min(wanted, limit))
    guarantee = {name: known[name].guarantee(pool) for name in by_team}
    weight = {name: known[name].weight for name in by_team}
    here = set(free)
    holdings = [
        holding(j, min(slot_cap(j), sum(1 for s in previous.get(j.job_id, ()) if s in here)))
        for j in members
    ]
    holdings = [h for h in holdings if h.held]
    answer: dict[str, tuple[Slot, ...]] = {}
    # A team whose jobs cannot use all of its share (a minimum that does not fit) hands
    # the rest on: its demand drops to what it used and the pool is shared again.
    for _ in range(len(by_team) + 1):
        shares = pool_shares(guarantee, demand, weight, len(free), holdings)
        carved = _carve(shares, free, by_team, previous)
        answer = {}
        used: dict[str, int] = {}
        for name, team_jobs in sorted(by_team.items()):
            mine = [h for h in holdings if h.team == name]
            sized = _giving_back(team_jobs, mine, shares[name])
            got = _run_inner(inner, sized, carved[name], cluster, previous)
            answer.update(got)
            used[name] = sum(len(s) for s in got.values())
        for name, team_jobs in by_team.items():
            held = sum(len(previous.get(j.job_id, ())) for j in team_jobs)
            if known[name].reclaim == "evict" and shares[name] < held:
                _evict_shrunk(answer, team_jobs, previous)
        short = [n for n in by_team if used[n] < shares[n]]
        hungry = [n for n in by_team if shares[n] < demand[n]]
        if not short or not hungry:
            break
        for name in short:
            demand[name] = used[name]
    return answer


def _giving_back(
    team_jobs: Sequence[JobRequest], holdings: Sequence[Holding], share: int
) -> list[JobRequest]:
    """``team_jobs`` as the inner policy sees them: as they are, or, when the team gives
    slots back, each held to what it keeps (:func:`kept_sizes`, the newest job shrinking
    first) and no job started meanwhile (it would only shrink the team's jobs further)."""
    if share >= sum(h.held for h in holdings):
        return list(team_jobs)
    sizes = kept_sizes(holdings, share)
    return [
        replace(j, min_slots=min(j.min_slots, n), max_slots=n, target_slots=None)
        for j in team_jobs
        if (n := sizes.get(j.job_id, 0))
    ]


def _evict_shrunk(
    answer: dict[str, tuple[Slot, ...]],
    team_jobs: Sequence[JobRequest],
    previous: Allocation,
) -> None:
    """Take every slot from the jobs of ``team_jobs`` that ``answer`` shrinks: eviction,
    the way a scheduler without in-place resize takes a loan back."""
    for job in team_jobs:
        got = answer.get(job.job_id, ())
        if got and len(got) < len(previous.get(job.job_id, ())):
            del answer[job.job_id]


def _carve(
    shares: Mapping[str, int],
    free: Sequence[Slot],
    by_team: Mapping[str, Sequence[JobRequest]],
    previous: Allocation,
) -> dict[str, list[Slot]]:
    """Which of ``free`` each team gets: what its jobs hold first (those of the jobs that
    started first before the others', so the newest loan is the first given back), then
    free slots on its own hosts, then the rest in host order."""
    pool = set(free)
    carved: dict[str, list[Slot]] = {}
    for name, team_jobs in sorted(by_team.items()):
        oldest_first = sorted(team_jobs, key=lambda j: holding(j, 0).since)
        held = [s for j in oldest_first for s in sorted(previous.get(j.job_id, ())) if s in pool]
        carved[name] = held[: shares[name]]
    kept = {s for slots in carved.values() for s in slots}
    rest = [s for s in free if s not in kept]
    position = {s: i for i, s in enumerate(free)}
    for name in sorted(by_team):
        need = shares[name] - len(carved[name])
        if need <= 0:
            continue
        own = {h for h, _ in carved[name]}
        rest.sort(key=lambda s: (s[0] not in own, position[s]))
        carved[name] += rest[:need]
        rest = rest[need:]
    return carved


def _run_inner(
    inner: Policy,
    team_jobs: Sequence[JobRequest],
    slots: Sequence[Slot],
    cluster: Cluster,
    previous: Allocation,
) -> dict[str, tuple[Slot, ...]]:
    """``inner``'s answer for one team on a cluster made of ``slots`` only.

    The inner policy sees each host with as many slots as the team has there, numbered
    from 0 in order; its answer is mapped back to the real slots.
    """
    if not slots:
        return {}
    hosts: list[Host] = []
    to_real: dict[Slot, Slot] = {}
    to_virtual: dict[Slot, Slot] = {}
    for host in cluster.hosts:
        mine = sorted(i for h, i in slots if h == host.name)
        if not mine:
            continue
        hosts.append(Host(host.name, len(mine), host.group, host.labels))
        for v, real in enumerate(mine):
            to_real[(host.name, v)] = (host.name, real)
            to_virtual[(host.name, real)] = (host.name, v)
    held = {
        j.job_id: tuple(to_virtual[s] for s in previous.get(j.job_id, ()) if s in to_virtual)
        for j in team_jobs
    }
    answer = inner.allocate(team_jobs, Cluster(tuple(hosts)), {k: v for k, v in held.items() if v})
    ids = {j.job_id for j in team_jobs}
    return {
        job_id: tuple(sorted(to_real[s] for s in got if s in to_real))
        for job_id, got in answer.items()
        if job_id in ids and got
    }


def _pool_figures(
    known: Mapping[str, Team],
    jobs: Sequence[JobRequest],
    cluster: Cluster,
    previous: Allocation,
    allocation: Allocation,
    pools: Sequence[str | None],
) -> dict[str | None, _Pool]:
    """Each pool's guarantees and slots used per team before and after the decision."""
    capacity = pool_capacity(cluster)
    grouped = sum(capacity.get(p, 0) for p in pools if p is not None)
    figures: dict[str | None, _Pool] = {}
    for pool in [*pools, None]:
        members = [j for j in jobs if j.group == pool]
        size = capacity.get(pool, 0) if pool is not None else capacity[None] - grouped
        figure = _Pool(
            guarantee={n: t.guarantee(pool) for n, t in known.items()},
            before=dict.fromkeys(known, 0),
            after=dict.fromkeys(known, 0),
            slots=size,
        )
        for job in members:
            figure.before[job.team] += len(previous.get(job.job_id, ()))
            figure.after[job.team] += len(allocation.get(job.job_id, ()))
        figures[pool] = figure
    return figures


def _usage(known: Mapping[str, Team], figures: Mapping[str | None, _Pool]) -> tuple[TeamUsage, ...]:
    """Each team's standing summed over the pools."""
    used = dict.fromkeys(known, 0)
    borrowed = dict.fromkeys(known, 0)
    lent = dict.fromkeys(known, 0)
    for figure in figures.values():
        took, gave, _ = loans(figure.guarantee, figure.after, figure.slots)
        for name in known:
            used[name] += figure.after[name]
            borrowed[name] += took[name]
            lent[name] += gave[name]
    return tuple(
        TeamUsage(
            team=name,
            guaranteed=team.total_guaranteed,
            limit=team.cap(),
            used=used[name],
            borrowed=borrowed[name],
            lent=lent[name],
        )
        for name, team in sorted(known.items())
    )


def _notes(
    jobs: Sequence[JobRequest],
    previous: Allocation,
    allocation: Allocation,
    figures: Mapping[str | None, _Pool],
) -> list[TeamNote]:
    """Why jobs grew into loans or gave slots back, on both sides of each loan."""
    notes: list[TeamNote] = []
    for pool, figure in figures.items():
        _, _, pairs = loans(figure.guarantee, figure.after, figure.slots)
        lenders: dict[str, list[str]] = {}
        for lender, borrower, _n in pairs:
            lenders.setdefault(borrower, []).append(lender)
        g, before, after = figure.guarantee, figure.before, figure.after
        # Teams taking their guarantee back, and borrowers giving slots back.
        takers = sorted(t for t in after if after[t] > before[t] and before[t] < g[t])
        givers = sorted(t for t in after if after[t] < before[t] and before[t] > g[t])
        for job in sorted((j for j in jobs if j.group == pool), key=lambda j: j.job_id):
            had = len(previous.get(job.job_id, ()))
            has = len(allocation.get(job.job_id, ()))
            if has < had and job.team in givers and takers:
                message = f"{had - has} slot(s) reclaimed by team {_names(takers)}"
                notes.append(TeamNote(job.job_id, "reclaimed", message))
            elif has > had and job.team in takers and givers:
                message = f"reclaimed by team {job.team} from team {_names(givers)}"
                notes.append(TeamNote(job.job_id, "reclaimed", message))
            elif has > had and job.team in lenders:
                message = f"lent to team {job.team} by team {_names(lenders[job.team])}"
                notes.append(TeamNote(job.job_id, "lent", message))
    return notes


def _names(teams: Sequence[str]) -> str:
    """Team names for a message: ``a``, ``a, b``."""
    return ", ".join(teams)


class TeamQueues:
    """Any policy, shared hierarchically over teams; see the module docstring.

    The allocation is :func:`decide`'s; :attr:`last` keeps the whole decision (each
    team's usage and the reasons) for the caller to record.
    """

    def __init__(self, inner: Policy, teams: Sequence[Team]) -> None:
        """Wrap ``inner`` for ``teams``; the wrapper goes by the inner policy's name."""
        self.inner = inner
        self.teams = tuple(teams)
        self.name = inner.name
        self.last: TeamDecision | None = None

    def allocate(
        self,
        jobs: Sequence[JobRequest],
        cluster: Cluster,
        previous: Allocation,
    ) -> dict[str, tuple[Slot, ...]]:
        """Team shares first, then the inner policy within each team."""
        self.last = decide(self.inner, self.teams, jobs, cluster, previous)
        return dict(self.last.allocation)
