"""Which of a job's slots each of its roles runs on, as a pure function.

The controller gives a multi-role job one set of slots (the policy sees one request per
job: every fixed role's replicas plus the elastic role's range). The job's agent splits
that set among the roles with :func:`assign_roles`: a fixed role keeps the slots it holds
(a resize never moves a parameter server or a chief), the elastic role takes the rest.
A fixed role some of whose replicas the controller stopped for good runs that many fewer
(:func:`fit_shapes`).

A replica given several GPUs holds that many slots of one host; its group knows it by
one name for all of them, ``host:2,3`` (:func:`group_replicas` forms them; a one-slot
replica's name is its slot's, ``host:2``; the format is :mod:`tidal.launch.slot_names`'s).
The process on it sees those GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tidal.launch.slot_names import join_slots, member_names, slot_host, slot_indices

__all__ = [
    "RoleShape",
    "assign_roles",
    "fit_shapes",
    "group_replicas",
    "replica_indices",
]


@dataclass(frozen=True)
class RoleShape:
    """What the split needs to know of a role: its name and replica range."""

    name: str
    min: int
    max: int
    #: A fixed role whose replicas may be stopped for good (:func:`tidal.model.stops_alone`).
    shrinkable: bool = False
    #: Slots one replica holds, all on one host.
    size: int = 1

    @property
    def elastic(self) -> bool:
        """Whether the role grows and shrinks (at most one role of a job does)."""
        return self.min != self.max


def _carve(free: Sequence[str], size: int, count: int) -> list[str]:
    """Up to ``count`` replicas of ``size`` slots each, every one on one host, out of
    ``free`` (taken in its order, hosts in the order they first appear)."""
    if size == 1:
        return list(free[:count])
    by_host: dict[str, list[str]] = {}
    for slot in free:
        by_host.setdefault(slot_host(slot), []).append(slot)
    out: list[str] = []
    for host, slots in by_host.items():
        for start in range(0, len(slots) - size + 1, size):
            if len(out) == count:
                return out
            chunk = slots[start : start + size]
            out.append(join_slots(host, (i for s in chunk for i in slot_indices(s))))
    return out


def _kept(previous: Sequence[str], free: Sequence[str], limit: int) -> list[str]:
    """The replicas of ``previous`` whose every slot is still in ``free`` (up to
    ``limit``): they go on where they run."""
    left = set(free)
    kept: list[str] = []
    for name in previous:
        covered = member_names(name)
        if len(kept) < limit and all(s in left for s in covered):
            kept.append(name)
            left.difference_update(covered)
    return kept


def _without(free: Sequence[str], names: Sequence[str]) -> list[str]:
    taken = {s for name in names for s in member_names(name)}
    return [s for s in free if s not in taken]


def group_replicas(slots: Sequence[str], size: int, previous: Sequence[str] = ()) -> list[str]:
    """``slots`` (one name each) as replicas of ``size`` slots on one host: those of
    ``previous`` whose slots are all still given keep running, the rest are formed host by
    host; slots too few on a host to form one more are left unused. One-slot replicas:
    ``slots`` as given."""
    if size == 1:
        return list(slots)
    kept = _kept(previous, slots, len(slots))
    free = _without(slots, kept)
    return kept + _carve(free, size, len(free))


def assign_roles(
    roles: Sequence[RoleShape],
    slots: Sequence[str],
    previous: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, list[str]]:
    """Each role's replicas (their names: :func:`group_replicas`) out of ``slots``,
    keeping what each role held in ``previous``.

    Fixed roles are served first, in the order given: each keeps the replicas it held
    whose slots are still in ``slots``, and tops up from the free ones (preferring slots
    the elastic role did not hold, so a refill moves as few elastic replicas as possible).
    The elastic role keeps its still-assigned replicas in their order and forms the rest,
    up to its ``max``. ``ValueError`` when ``slots`` cannot hold every fixed role and the
    elastic role's ``min`` (the controller never asks for that).
    """
    previous = previous or {}
    if len(set(slots)) != len(slots):
        raise ValueError(f"slots: each slot at most once, got {list(slots)}")
    elastic = [r for r in roles if r.elastic]
    if len(elastic) > 1:
        raise ValueError(f"roles: at most one elastic role, got {[r.name for r in elastic]}")
    stretchy = elastic[0] if elastic else None
    free = list(slots)
    taken: dict[str, list[str]] = {}
    for role in roles:
        if role is stretchy:
            continue
        kept = _kept(previous.get(role.name, ()), free, role.max)
        taken[role.name] = kept
        free = _without(free, kept)
    held_by_elastic = (
        {s for name in previous.get(stretchy.name, ()) for s in member_names(name)}
        if stretchy
        else set()
    )
    for role in roles:
        if role is stretchy:
            continue
        need = role.max - len(taken[role.name])
        if need <= 0:
            continue
        # Stable: slots nobody held first, then the elastic role's, each in given order.
        candidates = sorted(free, key=lambda s: s in held_by_elastic)
        refill = _carve(candidates, role.size, need)
        if len(refill) < need:
            raise ValueError(
                f"slots: {len(slots)} cannot hold role {role.name!r} ({role.max} replicas "
                f"of {role.size} slot(s)) beside the other fixed roles"
            )
        taken[role.name] = taken[role.name] + refill
        free = _without(free, refill)
    if stretchy is not None:
        kept = _kept(previous.get(stretchy.name, ()), free, stretchy.max)
        rest = _carve(_without(free, kept), stretchy.size, stretchy.max - len(kept))
        mine = kept + rest
        if len(mine) < stretchy.min:
            raise ValueError(
                f"slots: {len(slots)} leave {len(mine)} replica(s) for elastic role "
                f"{stretchy.name!r}, which needs at least {stretchy.min}"
            )
        taken[stretchy.name] = mine
    return {role.name: taken[role.name] for role in roles}


def fit_shapes(
    roles: Sequence[RoleShape],
    slots: Sequence[str],
    previous: Mapping[str, Sequence[str]],
) -> list[RoleShape]:
    """``roles`` as ``slots`` can hold them. When there are too few for every fixed role's
    replicas and the elastic role's ``min``, the controller stopped replicas of a
    shrinkable role for good: those roles run as many fewer, the ones that lost slots they
    held in ``previous`` first (an agent started afresh has no ``previous``: then any
    shrinkable role, in order). Otherwise ``roles`` unchanged: a fixed role that lost a
    slot while the count stays (a host left, another slot given) refills in
    :func:`assign_roles`."""
    need = sum(r.max * r.size for r in roles if not r.elastic)
    need += sum(r.min * r.size for r in roles if r.elastic)
    short = need - len(slots)
    if short <= 0:
        return list(roles)
    offered = set(slots)
    lost = {
        r.name: sum(
            any(s not in offered for s in member_names(name)) for name in previous.get(r.name, ())
        )
        for r in roles
    }
    cuts = {r.name: 0 for r in roles}
    # With no previous split (a fresh agent) every shrinkable role may be the one.
    for first in (True,) if previous else (True, False):
        for role in roles:
            if role.elastic or not role.shrinkable or short <= 0:
                continue
            room = role.max - 1 - cuts[role.name]
            cut = min(lost[role.name] if first else room, room, -(-short // role.size))
            cuts[role.name] += cut
            short -= cut * role.size
    return [
        RoleShape(
            r.name,
            min(r.min, r.max - cuts[r.name]),
            r.max - cuts[r.name],
            r.shrinkable,
            r.size,
        )
        for r in roles
    ]


def replica_indices(slots: Sequence[str], previous: Mapping[str, int]) -> dict[str, int]:
    """Each slot's replica index: a slot keeps the index it had in ``previous``; a new
    slot takes the lowest index no kept slot has (a replacement worker takes over the data
    stream of the one it replaces)."""
    kept = {s: previous[s] for s in slots if s in previous}
    used = set(kept.values())
    out: dict[str, int] = {}
    candidate = 0
    for slot in slots:
        if slot in kept:
            out[slot] = kept[slot]
            continue
        while candidate in used:
            candidate += 1
        out[slot] = candidate
        used.add(candidate)
    return out
