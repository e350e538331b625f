"""The policy interface: a pure function from plain data to an allocation.

The live controller and the simulator call the same policies with the same types, so a
decision measured in simulation is the decision users get. A policy does no I/O, reads no
clock and owns any randomness it uses (seeded through its constructor).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

#: A slot is one accelerator (or one virtual CPU slot) on a host: ``(host name, index)``.
Slot = tuple[str, int]

#: What a policy returns: for each job that holds slots, the slots it holds. Jobs absent
#: from the mapping hold nothing (queued, or preempted to zero).
Allocation = Mapping[str, tuple[Slot, ...]]


@dataclass(frozen=True)
class Host:
    """A machine with ``slots`` interchangeable slots, optionally in a resource group.

    A host marked ``leaving`` is being drained (an admin's ``tidal drain``, a cloud's
    preemption notice): it gets no new workers and its jobs move off it, before
    ``leaves_at`` (seconds since the epoch) when one is known; see
    :mod:`tidal.policy.drain`.
    """

    name: str
    slots: int
    group: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    leaving: bool = False
    leaves_at: float | None = None


@dataclass(frozen=True)
class Cluster:
    """The hosts a policy may hand out, in a stable order."""

    hosts: tuple[Host, ...]

    @property
    def total_slots(self) -> int:
        """Number of slots over all hosts."""
        return sum(h.slots for h in self.hosts)

    def slots(self) -> list[Slot]:
        """Every slot of the cluster, host by host."""
        return [(h.name, i) for h in self.hosts for i in range(h.slots)]

    @property
    def leaving(self) -> dict[str, float | None]:
        """The hosts marked leaving, each with the time it goes (``None``: not known)."""
        return {h.name: h.leaves_at for h in self.hosts if h.leaving}


@dataclass(frozen=True)
class ThroughputModel:
    """Pollux-style step-time model reported by a running job (used by ``goodput``).

    ``step_time(w, n, b)`` for ``w`` workers on ``n`` nodes with per-worker batch ``b`` is
    ``alpha_c + beta_c * b`` of compute plus a sync term that grows with the worker count;
    ``grad_noise_scale`` gives the statistical efficiency of a global batch. A worker's
    share of a batch lies in ``[min_local_batch, max_local_batch]``; with
    ``gradient_accumulation`` a larger share is computed in several micro-batches (one
    sync per step), so global batches up to ``max_global_batch`` are open to any worker
    count.
    """

    alpha_compute: float
    beta_compute: float
    alpha_sync_local: float
    beta_sync_local: float
    alpha_sync_node: float
    beta_sync_node: float
    gamma: float = 1.0
    grad_noise_scale: float = 0.0
    init_batch_size: int = 1
    max_local_batch: int = 1 << 30
    max_global_batch: int = 1 << 30
    min_local_batch: int = 1
    gradient_accumulation: bool = False

    @classmethod
    def unfitted(
        cls,
        *,
        init_batch_size: int,
        max_local_batch: int,
        max_global_batch: int,
        grad_noise_scale: float = 0.0,
        min_local_batch: int = 1,
        gradient_accumulation: bool = False,
    ) -> ThroughputModel:
        """A model with every step-time term zero: the template a fit starts from, which
        knows only the job's batch limits and (if measured) its gradient noise."""
        return cls(
            alpha_compute=0.0,
            beta_compute=0.0,
            alpha_sync_local=0.0,
            beta_sync_local=0.0,
            alpha_sync_node=0.0,
            beta_sync_node=0.0,
            grad_noise_scale=grad_noise_scale,
            init_batch_size=init_batch_size,
            max_local_batch=max_local_batch,
            max_global_batch=max_global_batch,
            min_local_batch=min_local_batch,
            gradient_accumulation=gradient_accumulation,
        )


@dataclass(frozen=True)
class JobRequest:
    """What a policy sees of one job that wants slots (queued or running)."""

    job_id: str
    min_slots: int
    max_slots: int
    priority: int = 5000
    #: Submission order key; ties broken by ``job_id``.
    submitted_at: float = 0.0
    #: Target resource group; ``None`` means any host.
    group: str | None = None
    #: Slot-seconds received so far (for least-attained-service policies).
    attained_service: float = 0.0
    #: A user's manual target (``tidal scale``) inside ``[min_slots, max_slots]``.
    target_slots: int | None = None
    throughput: ThroughputModel | None = None
    #: Seconds since the job started (``goodput`` discounts moving young jobs less than old
    #: ones); see :func:`job_request`.
    age: float = 0.0
    #: How many times this job's allocation has changed so far.
    reallocations: int = 0
    #: Slots one replica of the job's scaling role holds, all on one host (a replica
    #: given 2 GPUs holds 2); ``min_slots`` .. ``max_slots`` count slots.
    replica_slots: int = 1
    #: Slots each replica of the job's other (fixed) roles holds, each replica on one
    #: host; empty for a one-role job.
    gang_slots: tuple[int, ...] = ()
    #: The team whose queue the job waits in (read by :mod:`tidal.policy.teams`).
    team: str = "default"
    #: When the job first started (seconds, the caller's clock); ``None``: not yet. Team
    #: queues reclaim the loan of the job started last first (:mod:`tidal.policy.loan_order`).
    started_at: float | None = None

    @property
    def one_slot_replicas(self) -> bool:
        """Whether every replica of the job holds one slot (any set of slots fits it)."""
        return self.replica_slots == 1 and all(s == 1 for s in self.gang_slots)

    # The names these fields had before they were named for what they count. A policy
    # plugin (``tidal server --policy module:Class``) written against them keeps working
    # for one release, warned.
    @property
    def min_workers(self) -> int:
        """Deprecated: :attr:`min_slots`."""
        _renamed("min_workers", "min_slots")
        return self.min_slots

    @property
    def max_workers(self) -> int:
        """Deprecated: :attr:`max_slots`."""
        _renamed("max_workers", "max_slots")
        return self.max_slots

    @property
    def target_workers(self) -> int | None:
        """Deprecated: :attr:`target_slots`."""
        _renamed("target_workers", "target_slots")
        return self.target_slots


def _renamed(old: str, new: str) -> None:
    warnings.warn(
        f"JobRequest.{old} is deprecated: it counts slots, read JobRequest.{new}",
        DeprecationWarning,
        stacklevel=3,
    )


def job_request(
    job_id: str,
    *,
    min_slots: int,
    max_slots: int,
    now: float,
    age_from: float | None,
    initial_slots: int | None = None,
    target_slots: int | None = None,
    priority: int = 5000,
    submitted_at: float = 0.0,
    group: str | None = None,
    attained_service: float = 0.0,
    throughput: ThroughputModel | None = None,
    reallocations: int = 0,
    replica_slots: int = 1,
    gang_slots: tuple[int, ...] = (),
    team: str = "default",
    started_at: float | None = None,
) -> JobRequest:
    """What a policy sees of a job at ``now``: the one builder the controller and the
    simulator both call, so each field of :class:`JobRequest` is filled here.

    ``age_from``: when the job's age starts (the controller counts from its first start,
    the simulator from submission, as the Pollux artifact does); ``None``: age 0.
    ``initial_slots``: the job's ``initial`` size: with no user target, one below
    ``max_slots`` is the target the policy honours. The controller passes it for as long
    as the job lives (Arena's ``--workers``: the job is held there); a caller that passes
    it only until the job first runs (``None`` after) lets the policy size the job within
    ``[min_slots, max_slots]`` from then on. ``started_at``: when the job first started
    (``None``: not yet), which orders the loans team queues reclaim.
    """
    target = target_slots
    if target is None and initial_slots is not None and initial_slots < max_slots:
        target = initial_slots
    return JobRequest(
        job_id=job_id,
        min_slots=min_slots,
        max_slots=max_slots,
        priority=priority,
        submitted_at=submitted_at,
        group=group,
        attained_service=attained_service,
        target_slots=target,
        throughput=throughput,
        age=now - age_from if age_from is not None else 0.0,
        reallocations=reallocations,
        replica_slots=replica_slots,
        gang_slots=gang_slots,
        team=team,
        started_at=started_at,
    )


class Policy(Protocol):
    """A scheduling policy; ``allocate`` must be deterministic for equal inputs."""

    name: str

    def allocate(
        self,
        jobs: Sequence[JobRequest],
        cluster: Cluster,
        previous: Allocation,
    ) -> dict[str, tuple[Slot, ...]]:
        """Return the slots each job holds next; never more slots than a host has."""
        ...
