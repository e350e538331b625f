"""Turn per-job slot counts into concrete slots, moving as little as possible.

Every policy first decides *how many* slots each job holds and then calls :func:`place`,
so all of them share one set of placement rules:

* a job keeps the slots it already holds while its count is unchanged or grows;
* a shrinking job gives up slots on the hosts where it holds fewest first, so what stays is
  packed;
* new slots go to hosts the job already uses, then to the single host that fits the rest
  most tightly, and only then spread over the hosts with most free slots (fewest hosts);
* a job with a ``group`` only ever gets hosts of that group; jobs without one may use any
  host, and give way on a group's hosts when a job of that group needs them;
* where hosts carry the ``preemptible`` label (spot machines), new slots go to the other
  hosts first: a job's first worker and a job that cannot shrink stay clear of a
  preemption where they can, and an elastic job's slots on preemptible hosts are spread
  over them, so that one preemption costs it the fewest workers (:func:`place` only:
  :func:`~tidal.policy.packing.place_packed` packs, and leaves to :func:`place` only what
  it cannot pack).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from tidal.policy.api import Allocation, Cluster, Host, JobRequest, Slot


def held_counts(previous: Allocation) -> dict[str, int]:
    """How many slots each job holds in ``previous``."""
    return {job_id: len(slots) for job_id, slots in previous.items() if slots}


class FreeSlots:
    """Free slot indices per host, with a fast "host with exactly f free" lookup."""

    def __init__(self, cluster: Cluster) -> None:
        self.names = [h.name for h in cluster.hosts]
        self.index = {h.name: i for i, h in enumerate(cluster.hosts)}
        self.groups = [h.group for h in cluster.hosts]
        self.free: list[set[int]] = [set(range(h.slots)) for h in cluster.hosts]
        self.max_slots = max((h.slots for h in cluster.hosts), default=0)
        # buckets[f] is a lazy min-heap of host positions that had f free slots when pushed;
        # stale entries are skipped on read, which keeps every update O(log hosts).
        self.buckets: list[list[int]] = [[] for _ in range(self.max_slots + 1)]
        for i, free in enumerate(self.free):
            self.buckets[len(free)].append(i)

    def take(self, host: int, count: int) -> list[int]:
        """Take the ``count`` lowest free indices of ``host``."""
        chosen = sorted(self.free[host])[:count]
        self.free[host].difference_update(chosen)
        heapq.heappush(self.buckets[len(self.free[host])], host)
        return chosen

    def take_exact(self, host: int, index: int) -> bool:
        """Mark one given slot used; ``False`` when it is not free."""
        if index not in self.free[host]:
            return False
        self.free[host].discard(index)
        heapq.heappush(self.buckets[len(self.free[host])], host)
        return True

    def release(self, host: int, indices: Iterable[int]) -> None:
        """Give slots back."""
        self.free[host].update(indices)
        heapq.heappush(self.buckets[len(self.free[host])], host)

    def host_with_free(self, free: int) -> int | None:
        """Lowest-positioned host with exactly ``free`` free slots, if any."""
        bucket = self.buckets[free]
        while bucket:
            host = bucket[0]
            if len(self.free[host]) == free:
                return host
            heapq.heappop(bucket)
        return None

    def total_free(self, hosts: Iterable[int]) -> int:
        """Free slots over ``hosts``."""
        return sum(len(self.free[h]) for h in hosts)


def shrink(slots: list[Slot], keep: int) -> list[Slot]:
    """Keep ``keep`` of ``slots``, dropping first from the hosts holding fewest of them."""
    per_host: dict[str, list[Slot]] = {}
    for slot in slots:
        per_host.setdefault(slot[0], []).append(slot)
    order = sorted(per_host, key=lambda name: (len(per_host[name]), name))
    to_drop = len(slots) - keep
    dropped: set[Slot] = set()
    for name in order:
        if to_drop <= 0:
            break
        for slot in sorted(per_host[name], reverse=True)[:to_drop]:
            dropped.add(slot)
            to_drop -= 1
    return [s for s in slots if s not in dropped]


def _grow(free: FreeSlots, need: int, current: list[Slot], allowed: list[int] | None) -> list[Slot]:
    """Pick ``need`` new slots for a job that already holds ``current``."""
    # First fill the hosts the job already uses, fullest share first: fewer hosts per job.
    added = grow_on_own_hosts(free, need, current)
    need -= len(added)
    while need > 0:
        best = _best_host(free, need, allowed)
        if best is None:
            break
        take = min(need, len(free.free[best]))
        added += [(free.names[best], i) for i in free.take(best, take)]
        need -= take
    return added


def _best_host(free: FreeSlots, need: int, allowed: list[int] | None) -> int | None:
    """The host that fits ``need`` most tightly, else the one with most free slots."""
    if allowed is not None:
        candidates = [h for h in allowed if free.free[h]]
        if not candidates:
            return None
        fitting = [h for h in candidates if len(free.free[h]) >= need]
        if fitting:
            return min(fitting, key=lambda h: (len(free.free[h]), h))
        return max(candidates, key=lambda h: (len(free.free[h]), -h))
    for count in range(min(need, free.max_slots), free.max_slots + 1):
        host = free.host_with_free(count)
        if host is not None:
            return host
    for count in range(min(need, free.max_slots + 1) - 1, 0, -1):
        host = free.host_with_free(count)
        if host is not None:
            return host
    return None


def place(
    counts: Mapping[str, int],
    jobs: Mapping[str, JobRequest],
    cluster: Cluster,
    previous: Allocation,
) -> dict[str, tuple[Slot, ...]]:
    """Give each job in ``counts`` that many slots, keeping what it holds where possible.

    ``counts`` must be feasible: per group no more than the group's slots, in total no more
    than the cluster's. Jobs with a zero count are left out of the result.
    """
    free = FreeSlots(cluster)
    group_hosts: dict[str, list[int]] = {}
    for i, group in enumerate(free.groups):
        if group is not None:
            group_hosts.setdefault(group, []).append(i)

    def allowed_for(job_id: str) -> list[int] | None:
        group = jobs[job_id].group
        return None if group is None else group_hosts.get(group, [])

    held: dict[str, list[Slot]] = {}
    # Grouped jobs claim their kept slots first so an ungrouped job squatting on a group's
    # host can never block them.
    order = sorted(
        (j for j in counts if counts[j] > 0),
        key=lambda j: (jobs[j].group is None, j),
    )
    for job_id in order:
        allowed = allowed_for(job_id)
        allowed_set = None if allowed is None else set(allowed)
        kept: list[Slot] = []
        for name, index in previous.get(job_id, ()):
            host = free.index.get(name)
            if host is None or (allowed_set is not None and host not in allowed_set):
                continue
            if index < 0 or not free.take_exact(host, index):
                continue
            kept.append((name, index))
        if len(kept) > counts[job_id]:
            trimmed = shrink(kept, counts[job_id])
            dropped = set(kept) - set(trimmed)
            for name, index in dropped:
                free.release(free.index[name], [index])
            kept = trimmed
        held[job_id] = kept

    # A grouped job short of room on its group's hosts evicts ungrouped jobs from them.
    for job_id in order:
        allowed = allowed_for(job_id)
        if allowed is None:
            continue
        short = counts[job_id] - len(held[job_id]) - free.total_free(allowed)
        if short <= 0:
            continue
        allowed_set = set(allowed)
        for other in sorted(held, reverse=True):
            if short <= 0:
                break
            if jobs[other].group is not None:
                continue
            for slot in sorted(held[other], reverse=True):
                if short <= 0:
                    break
                host = free.index[slot[0]]
                if host in allowed_set:
                    held[other].remove(slot)
                    free.release(host, [slot[1]])
                    short -= 1

    spot = {i for i, h in enumerate(cluster.hosts) if preemptible(h)}

    def fixed(job_id: str) -> bool:
        return jobs[job_id].min_slots >= jobs[job_id].max_slots

    # Largest needs first: they are the hardest to pack; with preemptible hosts, jobs that
    # cannot shrink before them, so that they find the hosts that stay.
    growing = sorted(
        (j for j in order if counts[j] > len(held[j])),
        key=lambda j: (
            jobs[j].group is None,
            bool(spot) and not fixed(j),
            -(counts[j] - len(held[j])),
            j,
        ),
    )
    for job_id in growing:
        need = counts[job_id] - len(held[job_id])
        allowed = allowed_for(job_id)
        if spot:
            held[job_id] += _grow_spot_aware(free, need, held[job_id], allowed, spot, fixed(job_id))
        else:
            held[job_id] += _grow(free, need, held[job_id], allowed)

    return {job_id: tuple(sorted(slots)) for job_id, slots in held.items() if slots}


def preemptible(host: Host) -> bool:
    """Whether ``host`` carries the ``preemptible`` label (any value but false, 0, no):
    a spot machine the cloud may take at short notice."""
    value = host.labels.get("preemptible")
    return value is not None and value.strip().lower() not in ("false", "0", "no")


def _grow_spot_aware(
    free: FreeSlots,
    need: int,
    current: list[Slot],
    allowed: list[int] | None,
    spot: set[int],
    fixed: bool,
) -> list[Slot]:
    """New slots for a job on a cluster with preemptible hosts.

    Hosts that stay come first, for every job: there its first worker (rank 0, which
    holds what a resumed job would need) and a job that cannot shrink (``fixed``) are safe
    from a preemption. What does not fit there goes to preemptible hosts: a fixed job
    packed (fewest hosts that can take it away), an elastic job spread one slot at a time
    onto the preemptible host where it holds fewest, so that one preemption costs it the
    fewest workers (it shrinks in place and goes on).
    """
    hosts = range(len(free.names)) if allowed is None else allowed
    stable = [h for h in hosts if h not in spot]
    spots = [h for h in hosts if h in spot]
    on_stable = [s for s in current if free.index[s[0]] not in spot]
    added = grow_on_own_hosts(free, need, on_stable)
    added += _grow(free, need - len(added), [], stable) if need > len(added) and stable else []
    if need <= len(added) or not spots:
        return added
    if fixed:
        return added + _grow(free, need - len(added), [], spots)
    holds: dict[int, int] = {h: 0 for h in spots}
    for name, _ in [*current, *added]:
        if free.index[name] in holds:
            holds[free.index[name]] += 1
    while len(added) < need:
        open_hosts = [h for h in spots if free.free[h]]
        if not open_hosts:
            break
        host = min(open_hosts, key=lambda h: (holds[h], -len(free.free[h]), h))
        added += [(free.names[host], i) for i in free.take(host, 1)]
        holds[host] += 1
    return added


def grow_on_own_hosts(free: FreeSlots, need: int, current: list[Slot]) -> list[Slot]:
    """Up to ``need`` free slots on the hosts ``current`` already uses, fullest first."""
    used: dict[int, int] = {}
    for name, _ in current:
        used[free.index[name]] = used.get(free.index[name], 0) + 1
    added: list[Slot] = []
    for host in sorted(used, key=lambda h: (-used[h], h)):
        take = min(need - len(added), len(free.free[host]))
        if take > 0:
            added += [(free.names[host], i) for i in free.take(host, take)]
    return added
