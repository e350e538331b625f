"""Telling a cluster that grows on request how many slots the jobs would use
(``tidal server --autoscale``).

Each tick the policy says how many slots each job would use if the cluster had them
(:mod:`tidal.policy.autoscale`); the sum, capped at ``--max-slots``, goes to the backend
(:class:`~tidal.backends.base.ClusterScaling`) whenever it changes. Growing into new nodes
needs nothing here: the backend reports them as hosts and the policy hands their slots
out at the next tick. When jobs shrink or end the request shrinks with them, and the
cluster gives back the nodes left idle by its own rules (Ray's idle timeout).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tidal.backends.base import ClusterScaling
from tidal.controller.store.jobs import JobStore
from tidal.policy.api import Allocation, Cluster, JobRequest, Policy
from tidal.policy.autoscale import ScaleDecision, ScalingPolicy, fairshare_wants, scale_decision

__all__ = ["ClusterRequests"]

log = logging.getLogger(__name__)


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
        self.last: ScaleDecision | None = None

    def update(
        self,
        policy: Policy,
        jobs: Sequence[JobRequest],
        cluster: Cluster,
        held: Allocation,
    ) -> ScaleDecision | None:
        """Decide from the policy's own input, and tell the backend if the answer moved
        (``None``: the policy failed to say; the request stands, and scheduling goes on)."""
        try:
            if isinstance(policy, ScalingPolicy):
                wants = policy.slots_wanted(jobs, cluster, held)
            else:
                # A policy that does not say (static, tiresias, a plugin): fairshare's rule.
                wants = fairshare_wants(jobs, held)
        except Exception:
            log.exception("policy %s failed to say how many slots the jobs want", policy.name)
            return None
        decision = scale_decision(wants, cluster, self.max_slots)
        self.last = decision
        if decision.wanted_slots == self.requested:
            return decision
        try:
            self.backend.request_slots(decision.wanted_slots)
        except Exception:
            # Asked again next tick: the request is the whole want, not a difference.
            log.exception("asking the cluster for %d slot(s) failed", decision.wanted_slots)
            return decision
        self.requested = decision.wanted_slots
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
        }
        self.store.add_event(None, "autoscale", message, data=data)
        return decision
