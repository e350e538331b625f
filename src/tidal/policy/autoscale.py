"""How many slots the jobs would use: what a cluster autoscaler is told (``--autoscale``).

A policy shares out the slots a cluster has; this module answers the question before it:
how many slots would the jobs use well if the cluster had them? Each policy answers for
its own rule, as a pure function of the same input it allocates from:

- ``fairshare`` (and any policy that does not say): every running job grows to its cap
  (its maximum, or its manual target) and every queued job needs at least its minimum
  (:func:`fairshare_wants`).
- ``goodput``: a job wants the most slots at which its predicted speed-up still pays for
  them: its goodput per slot there is at least ``threshold`` of its goodput per slot at
  its minimum (:func:`efficient_slots`; see :mod:`tidal.policy.goodput_model` for the
  prediction).

:func:`scale_decision` adds the jobs' wants up, caps the sum at ``max_slots`` and compares
it with what the cluster has (:class:`ScaleDecision`). It also says what shape the room
must have: one :class:`SlotBundle` per replica, as wide as the replica's slots (a worker
of 2 GPUs needs 2 slots of one host) and carrying the node labels its job targets
(:class:`BundleShape`), so that an autoscaler starts nodes the jobs can use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from tidal.policy.api import Allocation, Cluster, JobRequest
from tidal.policy.budget import slot_cap
from tidal.policy.placement import held_counts

__all__ = [
    "DEFAULT_SPEEDUP_THRESHOLD",
    "BundleShape",
    "ScaleDecision",
    "ScalingPolicy",
    "SlotBundle",
    "bundles_for",
    "efficient_slots",
    "fairshare_wants",
    "floor_slots",
    "scale_decision",
]

#: A slot is worth asking for while the job's goodput per slot stays at least half of
#: what it is at its minimum: past that, the cluster pays more for the node than the job
#: gains from it.
DEFAULT_SPEEDUP_THRESHOLD = 0.5


@dataclass(frozen=True)
class SlotBundle:
    """Room for one replica: ``slots`` slots on one host carrying every one of ``labels``."""

    slots: int = 1
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BundleShape:
    """How a job's slots are cut into bundles: its scaling role's replicas of
    ``replica_slots`` each, its fixed roles' replicas of ``gang_slots``, all on hosts with
    ``labels`` (its target's node labels; empty: any host)."""

    replica_slots: int = 1
    gang_slots: tuple[int, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.replica_slots < 1 or any(w < 1 for w in self.gang_slots):
            raise ValueError(
                f"a replica holds at least one slot (got replica_slots={self.replica_slots}, "
                f"gang_slots={self.gang_slots})"
            )


#: A job of one-slot replicas on any host.
ONE_SLOT = BundleShape()


@dataclass(frozen=True)
class ScaleDecision:
    """What the cluster should offer the jobs, and what it offers now."""

    #: Slots the jobs would use, capped at ``max_slots``.
    wanted_slots: int
    #: Slots the cluster has now.
    cluster_slots: int
    #: Each job's want before the cap (for the logs and the status).
    by_job: Mapping[str, int]
    #: Whether ``max_slots`` cut the wants down.
    capped: bool = False
    #: The room asked for, one bundle per replica (their slots add up to
    #: ``wanted_slots``), job by job in the order the jobs came.
    bundles: tuple[SlotBundle, ...] = ()

    @property
    def extra_slots(self) -> int:
        """Slots the jobs want beyond what the cluster has (0 when it has enough)."""
        return max(0, self.wanted_slots - self.cluster_slots)


@runtime_checkable
class ScalingPolicy(Protocol):
    """A policy that says how many slots each job would use (see the module)."""

    def slots_wanted(
        self, jobs: Sequence[JobRequest], cluster: Cluster, previous: Allocation
    ) -> dict[str, int]:
        """Slots each job would use if the cluster had them (jobs left out want none)."""
        ...


def floor_slots(job: JobRequest) -> int:
    """Fewest slots ``job`` runs on (its minimum, at least one, within its cap)."""
    return max(1, min(job.min_slots, slot_cap(job)))


def fairshare_wants(jobs: Sequence[JobRequest], previous: Allocation) -> dict[str, int]:
    """Running jobs grow to their cap; queued jobs need their minimum to start."""
    held = held_counts(previous)
    wants: dict[str, int] = {}
    for job in jobs:
        if slot_cap(job) <= 0:
            continue
        wants[job.job_id] = slot_cap(job) if held.get(job.job_id, 0) > 0 else floor_slots(job)
    return wants


def efficient_slots(goodput: Sequence[float], floor: int, threshold: float) -> int:
    """The most slots ``w`` (at least ``floor``, below ``len(goodput)``) at which
    ``goodput[w] / w >= threshold * goodput[floor] / floor``: each slot still buys at
    least ``threshold`` of what a slot buys at the job's minimum.

    ``goodput[w]`` is the job's best goodput on ``w`` slots. The largest such ``w`` rather
    than the first that falls short: crossing a node boundary can cost more than the next
    slots win back, and a larger size past the dip may pay again.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    cap = len(goodput) - 1
    if floor >= cap:
        return max(0, cap)
    base = goodput[floor] / floor
    if base <= 0:
        return floor
    for size in range(cap, floor, -1):
        if goodput[size] / size >= threshold * base:
            return size
    return floor


def bundles_for(want: int, shape: BundleShape = ONE_SLOT) -> list[SlotBundle]:
    """The bundles of a job that wants ``want`` slots: one per fixed-role replica, then as
    many whole scaling replicas as the rest holds (a remainder smaller than a replica is
    no use to the job and is not asked for). A job that wants nothing gets none."""
    if want <= 0:
        return []
    gang = [SlotBundle(width, shape.labels) for width in shape.gang_slots]
    rest = max(0, want - sum(shape.gang_slots)) // shape.replica_slots
    return gang + [SlotBundle(shape.replica_slots, shape.labels) for _ in range(rest)]


def scale_decision(
    wants: Mapping[str, int],
    cluster: Cluster,
    max_slots: int | None = None,
    shapes: Mapping[str, BundleShape] | None = None,
) -> ScaleDecision:
    """The jobs' wants added up and capped at ``max_slots`` (``None``: no cap).

    Each job's want is cut into bundles by its shape in ``shapes`` (a job absent from it:
    one-slot replicas on any host). Under the cap, bundles are kept job by job in the
    order of ``wants`` while they fit; a bundle too wide for what is left is skipped and
    a narrower one after it may still fit.
    """
    if max_slots is not None and max_slots < 0:
        raise ValueError(f"max_slots must be >= 0, got {max_slots}")
    shapes = shapes or {}
    wanted = [
        bundle
        for job_id, want in wants.items()
        for bundle in bundles_for(want, shapes.get(job_id, ONE_SLOT))
    ]
    total = sum(b.slots for b in wanted)
    capped = max_slots is not None and total > max_slots
    kept: list[SlotBundle] = []
    room = max_slots if max_slots is not None else total
    for bundle in wanted:
        if bundle.slots <= room:
            kept.append(bundle)
            room -= bundle.slots
    return ScaleDecision(
        wanted_slots=sum(b.slots for b in kept),
        cluster_slots=cluster.total_slots,
        by_job=dict(wants),
        capped=capped,
        bundles=tuple(kept),
    )
