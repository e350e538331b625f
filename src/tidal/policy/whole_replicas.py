"""Whole replicas: fit any policy's slots to jobs whose replicas hold several slots each.

A replica given ``n`` GPUs holds ``n`` slots, all on one host. The policies hand out slot
counts and place single slots, so on their own they may give such a job a count that is
not a sum of its replica sizes, or split one replica over two hosts. :class:`WholeReplicas`
wraps any policy and repairs its answer: each multi-slot job keeps the subset of its slots
that holds whole replicas (:func:`fit_replicas`), then jobs that lost replicas get whole
ones back from the slots so freed. Jobs whose replicas all hold one slot are untouched.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidal.policy.api import Allocation, Cluster, JobRequest, Policy, Slot
from tidal.policy.budget import queue_order


def _replica_range(job: JobRequest) -> tuple[int, int]:
    """Fewest and most scaling replicas ``job`` may run, its gang counted out."""
    size = max(1, job.replica_slots)
    gang = sum(max(1, s) for s in job.gang_slots)
    low = -(-max(0, job.min_slots - gang) // size)  # ceil: never below min_slots
    return low, max(0, job.max_slots - gang) // size


#: Most gang states the exact search visits before it settles for plain first fit: the
#: search is exponential in the gang's size and a big gang on mixed hosts would stall.
SEARCH_STATES = 5_000


class _SearchTooLarge(Exception):
    """The exact gang search ran past :data:`SEARCH_STATES`."""


def _first_fit(counts: list[int], sizes: list[int]) -> list[int] | None:
    """First-fit host position of each of ``sizes`` over ``counts``, or ``None``."""
    rem = list(counts)
    hosts: list[int] = []
    for need in sizes:
        h = next((h for h, r in enumerate(rem) if r >= need), None)
        if h is None:
            return None
        rem[h] -= need
        hosts.append(h)
    return hosts


def _place_gang(counts: list[int], sizes: list[int], size: int, most: int) -> list[int] | None:
    """Host position of each gang replica (``sizes`` largest first), or ``None``.

    Among the placements that leave room for the most scaling replicas of ``size`` slots
    (up to ``most``), take the one first-fit decreasing over the hosts in their given order
    would pick: plain first fit is that placement whenever it is optimal, and the search
    only differs where first fit strands room (4+3+3 on two hosts of 6, say), which would
    also make the answer fail to fit itself again. Past :data:`SEARCH_STATES`, first fit.
    """
    memo: dict[tuple[int, tuple[int, ...]], int] = {}

    def best(i: int, rem: tuple[int, ...]) -> int:
        # Only the multiset of free counts matters for what is still reachable.
        key = (i, tuple(sorted(rem)))
        if key in memo:
            return memo[key]
        if len(memo) >= SEARCH_STATES:
            raise _SearchTooLarge
        spare = sum(rem) - sum(sizes[i:])
        # Neither more than the spare slots nor more than the hosts hold before the rest of
        # the gang is placed: reaching this bound ends the search of this state.
        bound = min(most, spare // size, sum(r // size for r in rem))
        value = -1
        if i == len(sizes):
            value = min(most, sum(r // size for r in rem))
        elif spare >= 0:
            tried: set[int] = set()
            for h, r in enumerate(rem):
                if r >= sizes[i] and r not in tried:
                    tried.add(r)
                    value = max(value, best(i + 1, _minus(rem, h, sizes[i])))
                    if value >= bound:
                        break  # no placement can do better: keep the first that does
        memo[key] = value
        return value

    try:
        rem = tuple(counts)
        goal = best(0, rem)
        if goal < 0:
            return None
        hosts: list[int] = []
        for i, need in enumerate(sizes):
            h = next(
                h
                for h, r in enumerate(rem)
                if r >= need and best(i + 1, _minus(rem, h, need)) == goal
            )
            hosts.append(h)
            rem = _minus(rem, h, need)
        return hosts
    except _SearchTooLarge:
        return _first_fit(counts, sizes)


def _minus(rem: tuple[int, ...], host: int, count: int) -> tuple[int, ...]:
    """``rem`` with ``count`` taken from position ``host``."""
    return (*rem[:host], rem[host] - count, *rem[host + 1 :])


def _pick(free: Sequence[Slot], count: int, previous: set[Slot]) -> list[Slot]:
    """``count`` of one host's ``free`` slots: the job's current ones first (running
    replicas stay put), then the lowest indices."""
    return sorted(free, key=lambda s: (s not in previous, s[1]))[:count]


def fit_replicas(
    job: JobRequest, slots: Sequence[Slot], previous: Sequence[Slot] = ()
) -> tuple[Slot, ...]:
    """The subset of ``slots`` holding ``job``'s gang plus as many scaling replicas as fit.

    Every replica lies wholly on one host and the scaling replicas stay within the job's
    bounds; ``()`` when the gang and the fewest scaling replicas cannot be placed on
    ``slots``. Slots of a host are interchangeable, so only their count per host matters.
    Gang replicas go largest first on the hosts holding most of ``slots``; scaling replicas
    go to the hosts with most room, so the job spans few hosts. Of each host the slots in
    ``previous`` are kept first. A job of one-slot replicas gets all of ``slots``, sorted.
    """
    if job.one_slot_replicas:
        return tuple(sorted(slots))
    per_host: dict[str, list[Slot]] = {}
    for slot in sorted(set(slots)):
        per_host.setdefault(slot[0], []).append(slot)
    names = sorted(per_host, key=lambda n: (-len(per_host[n]), n))
    counts = [len(per_host[n]) for n in names]
    size = max(1, job.replica_slots)
    low, high = _replica_range(job)
    sizes = sorted((max(1, s) for s in job.gang_slots), reverse=True)
    gang_hosts = _place_gang(counts, sizes, size, high)
    if gang_hosts is None:
        return ()
    rem = list(counts)
    for h, need in zip(gang_hosts, sizes, strict=True):
        rem[h] -= need
    kept = set(previous)
    held = [sum(s in kept for s in per_host[n]) for n in names]
    order = sorted(range(len(names)), key=lambda h: (-(rem[h] // size), -held[h], names[h]))
    left = min(high, sum(r // size for r in rem))
    if left < low:
        return ()
    use = [c - r for c, r in zip(counts, rem, strict=True)]
    for h in order:
        replicas = min(left, rem[h] // size)
        use[h] += replicas * size
        left -= replicas
    chosen = [s for h, n in enumerate(names) for s in _pick(per_host[n], use[h], kept)]
    return tuple(sorted(chosen))


class WholeReplicas:
    """Any policy, with each multi-slot job's answer cut and topped up to whole replicas.

    A multi-slot job keeps :func:`fit_replicas` of the slots the inner policy gave it, so
    its count may be rounded down to a sum of whole replicas; then jobs that lost replicas,
    in queue order, get whole replicas on hosts with enough free slots (the job's own hosts
    first, then the tightest fit), never more slots than the inner policy gave them. A job
    whose gang and fewest replicas did not fit its slots is placed whole from free slots, or
    gets nothing. Slots no job can use stay idle: one-slot jobs keep the inner's answer.
    """

    def __init__(self, inner: Policy) -> None:
        """Wrap ``inner``; the wrapper goes by the inner policy's name."""
        self.inner = inner
        self.name = inner.name

    def allocate(
        self,
        jobs: Sequence[JobRequest],
        cluster: Cluster,
        previous: Allocation,
    ) -> dict[str, tuple[Slot, ...]]:
        """The inner policy's answer with every multi-slot job made of whole replicas."""
        answer = self.inner.allocate(jobs, cluster, previous)
        multi = sorted((j for j in jobs if not j.one_slot_replicas), key=queue_order)
        if not multi:
            return answer  # unchanged: the figures of one-slot workloads must not move
        hosts = {h.name: h for h in cluster.hosts}

        def allowed(job: JobRequest, slot: Slot) -> bool:
            host = hosts.get(slot[0])
            if host is None or not 0 <= slot[1] < host.slots:
                return False
            return job.group is None or host.group == job.group

        result = dict(answer)
        wanted: dict[str, int] = {}
        for job in multi:
            # Slots outside the job's group or the cluster are dropped, never handed on.
            given = [s for s in answer.get(job.job_id, ()) if allowed(job, s)]
            wanted[job.job_id] = min(len(given), job.max_slots)
            fitted = fit_replicas(job, given, previous.get(job.job_id, ()))
            result.pop(job.job_id, None)
            if fitted:
                result[job.job_id] = fitted
        used = {s for held in result.values() for s in held}
        free = {
            h.name: [(h.name, i) for i in range(h.slots) if (h.name, i) not in used]
            for h in cluster.hosts
        }
        for job in multi:
            have = list(result.get(job.job_id, ()))
            if len(have) < wanted[job.job_id]:
                grown = _top_up(job, have, wanted[job.job_id], cluster, free, previous)
                if grown:
                    result[job.job_id] = tuple(sorted(grown))
        return result


def _top_up(
    job: JobRequest,
    have: list[Slot],
    cap: int,
    cluster: Cluster,
    free: dict[str, list[Slot]],
    previous: Allocation,
) -> list[Slot]:
    """``have`` plus whole replicas from ``free`` (which it updates), up to ``cap`` slots.

    ``have`` must be whole replicas (a :func:`fit_replicas` answer). A job holding nothing
    must first place its gang and fewest replicas, else it gets nothing and ``free`` is left
    as it was. Each replica goes to the host the job holds most of that has room, else to
    the host whose free slots fit it most tightly.
    """
    size = max(1, job.replica_slots)
    low, high = _replica_range(job)
    gang = sorted((max(1, s) for s in job.gang_slots), reverse=True)
    if have:
        mandatory: list[int] = []
        running = (len(have) - sum(gang)) // size
        optional = min(high - running, (cap - len(have)) // size)
    else:
        mandatory = gang + [size] * low
        if low > high or sum(mandatory) > cap:
            return []
        optional = min(high - low, (cap - sum(mandatory)) // size)
    names = [h.name for h in cluster.hosts if job.group is None or h.group == job.group]
    kept = set(previous.get(job.job_id, ()))
    mine = {n: 0 for n in names}
    for slot in have:
        mine[slot[0]] = mine.get(slot[0], 0) + 1
    added: list[Slot] = []
    for i, need in enumerate(mandatory + [size] * max(0, optional)):
        fits = [n for n in names if len(free[n]) >= need]
        own = [n for n in fits if mine[n] > 0]
        if own:
            host = min(own, key=lambda n: (-mine[n], n))
        elif fits:
            host = min(fits, key=lambda n: (len(free[n]), n))
        elif i < len(mandatory):
            for slot in added:  # the minimum does not fit: give everything back
                free[slot[0]].append(slot)
            return []
        else:
            break  # every further replica has the same size: none fits either
        chosen = _pick(free[host], need, kept)
        free[host] = [s for s in free[host] if s not in chosen]
        mine[host] += need
        added += chosen
    return have + added
