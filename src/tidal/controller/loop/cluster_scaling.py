"""Telling a cluster that grows on request how many slots the jobs would use
(``tidal server --autoscale``).

Each tick the policy says how many slots each job would use if the cluster had them
(:mod:`tidal.policy.autoscale`); the sum, capped at ``--max-slots``, goes to the backend
(:class:`~tidal.backends.base.ClusterScaling`) whenever it changes. Growing into new nodes
needs nothing here: the backend reports them as hosts and the policy hands their slots
out at the next tick. When jobs shrink or end the request shrinks with them, and the
cluster gives back the nodes left idle by its own rules (Ray's idle timeout).

A backend that takes room by shape (:class:`~tidal.backends.base.BundleScaling`) is asked
for one bundle per replica: as wide as the replica's slots, with the node labels its job
needs (:func:`node_labels`: its target's labels and those its target group picks hosts by).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from tidal.backends.base import BundleScaling, ClusterScaling
from tidal.controller.resource_groups import ClusterConfig
from tidal.controller.store.jobs import JobStore
from tidal.model import Placement
from tidal.policy.api import Allocation, Cluster, JobRequest, Policy
from tidal.policy.autoscale import (
    BundleShape,
    ScaleDecision,
    ScalingPolicy,
    SlotBundle,
    fairshare_wants,
    scale_decision,
)
from tidal.policy.budget import queue_order

__all__ = ["ClusterRequests", "node_labels"]

log = logging.getLogger(__name__)


def node_labels(placement: Placement, groups: ClusterConfig | None) -> dict[str, str]:
    """The labels a new node must carry to take a job placed by ``placement``: those of
    its target group in the server's config (a group that picks hosts by name gives none:
    no selector names a node that does not exist yet), then the job's own node labels."""
    labels: dict[str, str] = {}
    if placement.group is not None and groups is not None:
        group = next((g for g in groups.groups if g.name == placement.group), None)
        if group is not None:
            labels.update(group.labels)
    labels.update(placement.labels)
    return labels


def _bundle_counts(bundles: Sequence[SlotBundle]) -> list[dict[str, Any]]:
    """The bundles as an event records them: each shape once, with how many."""
    counts = Counter((b.slots, tuple(sorted(b.labels.items()))) for b in bundles)
    return [
        {"slots": slots, "labels": dict(labels), "count": n}
        for (slots, labels), n in sorted(counts.items())
    ]


class ClusterRequests:
    """What the loop last asked the cluster for; asks again only when it changes."""

    def __init__(
        self, backend: ClusterScaling, store: JobStore, max_slots: int | None = None
    ) -> None:
        """``max_slots``: the most slots asked for in all (``None``: no cap)."""
        if max_slots is not None and max_slots < 1:
            raise ValueError(f"max_slots must be at least 1, got {max_slots}")
        self.backend = backend
        self.store = store
        self.max_slots = max_slots
        #: The slots last asked for (``None``: nothing asked yet).
        self.requested: int | None = None
        #: The bundles last asked for (``None``: nothing asked yet).
        self.requested_bundles: tuple[SlotBundle, ...] | None = None
        self.last: ScaleDecision | None = None

    def update(
        self,
        policy: Policy,
        jobs: Sequence[JobRequest],
        cluster: Cluster,
        held: Allocation,
        labels: Mapping[str, Mapping[str, str]] | None = None,
    ) -> ScaleDecision | None:
        """Decide from the policy's own input, and tell the backend if the answer moved
        (``None``: the policy failed to say; the request stands, and scheduling goes on).
        ``labels``: the node labels each job needs (:func:`node_labels`; absent: any)."""
        try:
            if isinstance(policy, ScalingPolicy):
                wants = policy.slots_wanted(jobs, cluster, held)
            else:
                # A policy that does not say (static, tiresias, a plugin): fairshare's rule.
                wants = fairshare_wants(jobs, held)
        except Exception:
            log.exception("policy %s failed to say how many slots the jobs want", policy.name)
            return None
        labels = labels or {}
        # Under --max-slots the first jobs' bundles are kept: the queue's order.
        first = sorted((j for j in jobs if j.job_id in wants), key=queue_order)
        wants = {j.job_id: wants[j.job_id] for j in first} | wants
        shapes = {
            job.job_id: BundleShape(job.replica_slots, job.gang_slots, labels.get(job.job_id, {}))
            for job in jobs
        }
        decision = scale_decision(wants, cluster, self.max_slots, shapes)
        self.last = decision
        by_shape = isinstance(self.backend, BundleScaling)
        if by_shape and decision.bundles == self.requested_bundles:
            return decision
        if not by_shape and decision.wanted_slots == self.requested:
            return decision
        try:
            if isinstance(self.backend, BundleScaling):
                self.backend.request_bundles(decision.bundles)
            else:
                self.backend.request_slots(decision.wanted_slots)
        except Exception:
            # Asked again next tick: the request is the whole want, not a difference.
            log.exception("asking the cluster for %d slot(s) failed", decision.wanted_slots)
            return decision
        self.requested = decision.wanted_slots
        self.requested_bundles = decision.bundles
        message = (
            f"asked the cluster for {decision.wanted_slots} slot(s): "
            f"{decision.extra_slots} beyond its {decision.cluster_slots}"
        )
        if decision.capped:
            message += f" (capped by --max-slots {self.max_slots})"
        log.info("%s", message)
        data = {
            "wanted_slots": decision.wanted_slots,
            "cluster_slots": decision.cluster_slots,
            "extra_slots": decision.extra_slots,
            "capped": decision.capped,
            # Each job's want before the cap, and the shapes asked for.
            "by_job": dict(decision.by_job),
            "bundles": _bundle_counts(decision.bundles),
        }
        self.store.add_event(None, "autoscale", message, data=data)
        return decision
