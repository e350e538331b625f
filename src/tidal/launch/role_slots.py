"""Which of a job's slots each of its roles runs on, as a pure function.

The controller gives a multi-role job one set of slots (the policy sees one request per
job: every fixed role's replicas plus the elastic role's range). The job's agent splits
that set among the roles with :func:`assign_roles`: a fixed role keeps the slots it holds
(a resize never moves a parameter server or a chief), the elastic role takes the rest.
A fixed role some of whose replicas the controller stopped for good runs that many fewer
(:func:`fit_shapes`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["RoleShape", "assign_roles", "fit_shapes", "replica_indices"]


@dataclass(frozen=True)
class RoleShape:
    """What the split needs to know of a role: its name and replica range."""

    name: str
    min: int
    max: int
    #: A fixed role whose replicas may be stopped for good (:func:`tidal.model.stops_alone`).
    shrinkable: bool = False

    @property
    def elastic(self) -> bool:
        """Whether the role grows and shrinks (at most one role of a job does)."""
        return self.min != self.max


def assign_roles(
    roles: Sequence[RoleShape],
    slots: Sequence[str],
    previous: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, list[str]]:
    """Each role's slots out of ``slots``, keeping what each role held in ``previous``.

    Fixed roles are served first, in the order given: each keeps the slots it held that
    are still in ``slots``, and tops up from the free ones (preferring slots the elastic
    role did not hold, so a refill moves as few elastic replicas as possible). The elastic
    role keeps its still-assigned slots in their order and takes the rest, up to its
    ``max``. ``ValueError`` when ``slots`` cannot hold every fixed role and the elastic
    role's ``min`` (the controller never asks for that).
    """
    previous = previous or {}
    if len(set(slots)) != len(slots):
        raise ValueError(f"slots: each slot at most once, got {list(slots)}")
    elastic = [r for r in roles if r.elastic]
    if len(elastic) > 1:
        raise ValueError(f"roles: at most one elastic role, got {[r.name for r in elastic]}")
    stretchy = elastic[0] if elastic else None
    offered = set(slots)
    free = list(slots)
    taken: dict[str, list[str]] = {}
    for role in roles:
        if role is stretchy:
            continue
        kept = [s for s in previous.get(role.name, ()) if s in offered and s in free][: role.max]
        taken[role.name] = kept
        free = [s for s in free if s not in kept]
    held_by_elastic = set(previous.get(stretchy.name, ())) if stretchy else set()
    for role in roles:
        if role is stretchy:
            continue
        need = role.max - len(taken[role.name])
        if need <= 0:
            continue
        # Stable: slots nobody held first, then the elastic role's, each in given order.
        candidates = sorted(free, key=lambda s: s in held_by_elastic)
        if len(candidates) < need:
            raise ValueError(
                f"slots: {len(slots)} cannot hold role {role.name!r} ({role.max} replicas) "
                "beside the other fixed roles"
            )
        refill = candidates[:need]
        taken[role.name] = taken[role.name] + refill
        free = [s for s in free if s not in refill]
    if stretchy is not None:
        kept = [s for s in previous.get(stretchy.name, ()) if s in free]
        rest = [s for s in free if s not in kept]
        mine = (kept + rest)[: stretchy.max]
        if len(mine) < stretchy.min:
            raise ValueError(
                f"slots: {len(slots)} leave {len(mine)} for elastic role {stretchy.name!r}, "
                f"which needs at least {stretchy.min}"
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
    need = sum(r.max for r in roles if not r.elastic) + sum(r.min for r in roles if r.elastic)
    short = need - len(slots)
    if short <= 0:
        return list(roles)
    offered = set(slots)
    lost = {r.name: sum(s not in offered for s in previous.get(r.name, ())) for r in roles}
    cuts = {r.name: 0 for r in roles}
    # With no previous split (a fresh agent) every shrinkable role may be the one.
    for first in (True,) if previous else (True, False):
        for role in roles:
            if role.elastic or not role.shrinkable or short <= 0:
                continue
            room = role.max - 1 - cuts[role.name]
            cut = min(lost[role.name] if first else room, room, short)
            cuts[role.name] += cut
            short -= cut
    return [
        RoleShape(r.name, min(r.min, r.max - cuts[r.name]), r.max - cuts[r.name], r.shrinkable)
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
