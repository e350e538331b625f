"""Packed placement: a job whose count changes is placed afresh on as few hosts as it can.

For the policies whose models assume packed hosts (``goodput``): a job spread over more
hosts than it needs runs slower than they predict. The placement rules shared by every
policy, and the fallback for what cannot be packed, are :mod:`tidal.policy.placement`.
"""

from __future__ import annotations

from collections.abc import Mapping

from tidal.policy.api import Allocation, Cluster, JobRequest, Slot
from tidal.policy.placement import FreeSlots, grow_on_own_hosts, place, shrink

__all__ = ["place_packed"]


def _take_packed(free: FreeSlots, count: int, allowed: list[int] | None) -> list[Slot] | None:
    """Take ``count`` slots on as few hosts as possible, or take nothing and return ``None``.

    Whole free hosts first (lowest first), then the remainder on the host whose free slots
    fit it most tightly. ``None`` when the free slots are too fragmented for that.
    """
    size = free.max_slots
    if size <= 0:
        return None
    whole, rest = divmod(count, size)
    taken: list[tuple[int, list[int]]] = []

    def fail() -> None:
        for host, indices in taken:
            free.release(host, indices)

    for _ in range(whole):
        if allowed is None:
            # The free-count buckets find a host in O(log hosts); this runs per moved job.
            host = free.host_with_free(size)
        else:
            host = next((h for h in allowed if len(free.free[h]) == size), None)
        if host is None:
            fail()
            return None
        taken.append((host, free.take(host, size)))
    if rest:
        if allowed is None:
            host = next(
                (h for f in range(rest, size + 1) if (h := free.host_with_free(f)) is not None),
                None,
            )
        else:
            fitting = [h for h in allowed if len(free.free[h]) >= rest]
            host = min(fitting, key=lambda h: (len(free.free[h]), h)) if fitting else None
        if host is None:
            fail()
            return None
        taken.append((host, free.take(host, rest)))
    return [(free.names[h], i) for h, indices in taken for i in indices]


def place_packed(
    counts: Mapping[str, int],
    jobs: Mapping[str, JobRequest],
    cluster: Cluster,
    previous: Allocation,
) -> dict[str, tuple[Slot, ...]]:
    """Like :func:`place`, but a job whose count changes is placed afresh, packed.

    A job that is resized restarts anyway (in checkpoint-restart systems) or re-forms its
    process group (in tidal), so keeping its scattered slots buys nothing, while a job on
    more hosts than it needs runs slower than any model that assumes packed hosts predicts.
    Jobs keeping their count keep their slots; a resized job whose slots stay packed after
    it shrinks, or after it grows on its own hosts, is resized in place (a live job then
    only adds or drops workers, and two jobs never wait on each other's slots); other
    resized and new jobs are placed largest
    first on whole free hosts plus the tightest fit for the remainder; a job already spread
    over more hosts than it needs is repacked when the free slots allow it. Whatever cannot
    be packed falls back to :func:`place`'s rules.
    """
    free = FreeSlots(cluster)
    size = free.max_slots

    def minimal_hosts(n: int) -> int:
        return -(-n // max(size, 1))

    kept: dict[str, list[Slot]] = {}
    moving: list[str] = []
    spread: list[str] = []
    for job_id in sorted(j for j in counts if counts[j] > 0):
        held = [s for s in previous.get(job_id, ()) if s[0] in free.index]
        if len(held) == counts[job_id] and jobs[job_id].group is None:
            kept[job_id] = held
            for name, index in held:
                free.take_exact(free.index[name], index)
            if len({name for name, _ in held}) > minimal_hosts(len(held)):
                spread.append(job_id)
        else:
            moving.append(job_id)
    result: dict[str, tuple[Slot, ...]] = {j: tuple(sorted(s)) for j, s in kept.items()}
    moving = _resize_in_place(free, counts, jobs, previous, moving, result)
    unplaced: dict[str, int] = {}
    for job_id in sorted(moving, key=lambda j: (-counts[j], j)):
        allowed = None
        if jobs[job_id].group is not None:
            allowed = [i for i, g in enumerate(free.groups) if g == jobs[job_id].group]
        slots = _take_packed(free, counts[job_id], allowed)
        if slots is None:
            unplaced[job_id] = counts[job_id]
            continue
        result[job_id] = tuple(sorted(slots))
    # Repack spread jobs, most spread first, only where a packed spot exists.
    for job_id in sorted(spread, key=lambda j: (-counts[j], j)):
        held = kept[job_id]
        for name, index in held:
            free.release(free.index[name], [index])
        slots = _take_packed(free, counts[job_id], None)
        if slots is None:
            for name, index in held:
                free.take_exact(free.index[name], index)
            continue
        result[job_id] = tuple(sorted(slots))
    if unplaced:
        # Fragmented free slots: let the general rules fit what is left.
        fixed = {j: s for j, s in result.items()}
        rest = place(
            {**{j: len(s) for j, s in fixed.items()}, **unplaced},
            jobs,
            cluster,
            {**fixed, **{j: previous.get(j, ()) for j in unplaced}},
        )
        return rest
    return result


def _resize_in_place(
    free: FreeSlots,
    counts: Mapping[str, int],
    jobs: Mapping[str, JobRequest],
    previous: Allocation,
    moving: list[str],
    result: dict[str, tuple[Slot, ...]],
) -> list[str]:
    """Resize the ``moving`` jobs that can stay packed where they are; returns the rest.

    Shrinking jobs keep a packed subset of their slots; growing jobs then fill the hosts
    they already use. A job is left to be placed afresh when the result would spread over
    more hosts than its new count needs.
    """
    size = max(free.max_slots, 1)
    held = {
        j: [s for s in previous.get(j, ()) if s[0] in free.index]
        for j in moving
        if jobs[j].group is None
    }
    held = {j: slots for j, slots in held.items() if slots}
    rest = [j for j in moving if j not in held]
    for job_id in sorted(held):
        trimmed = shrink(held[job_id], min(counts[job_id], len(held[job_id])))
        # Every kept slot is reserved before any job grows, so none is handed to another.
        held[job_id] = [s for s in trimmed if free.take_exact(free.index[s[0]], s[1])]
    for job_id in sorted(held, key=lambda j: (-counts[j], j)):
        slots = held[job_id]
        need = counts[job_id] - len(slots)
        if need > 0:
            slots = slots + grow_on_own_hosts(free, need, slots)
        hosts = {name for name, _ in slots}
        if len(slots) == counts[job_id] and len(hosts) <= -(-len(slots) // size):
            result[job_id] = tuple(sorted(slots))
            continue
        for name, index in slots:
            free.release(free.index[name], [index])
        rest.append(job_id)
    return rest
