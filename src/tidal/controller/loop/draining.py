"""Hosts being drained, as the loop sees them: stored, marked on the policy's cluster,
and what the last decision asked of the jobs still on them.

A drain is written to the store (a server restart keeps it) and kept here in memory, so
a tick reads no table for it; the API's threads mark and unmark hosts through
:class:`DrainBook` while the loop's thread reads it, hence the lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from tidal.controller.cluster import ClusterModel
from tidal.controller.store.drains import DrainSource, HostDrain
from tidal.controller.store.jobs import JobStore
from tidal.policy.api import Cluster, Slot
from tidal.policy.drain import CheckpointOrder, DrainDecision

__all__ = ["DrainBook", "DrainState", "UnknownHost"]

log = logging.getLogger(__name__)


class UnknownHost(LookupError):
    """A drain asked for a host the cluster does not have."""


@dataclass(frozen=True)
class DrainState:
    """A draining host as the API shows it: the drain, and what is still on the host."""

    drain: HostDrain
    #: Jobs with a live worker on the host (as of the last tick).
    remaining: tuple[str, ...]
    #: Jobs that cannot leave in place and checkpoint before the host goes.
    checkpoints: tuple[CheckpointOrder, ...]


class DrainBook:
    """The draining hosts of one controller (loaded from its store at start)."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._drains: dict[str, HostDrain] = store.drains()
        self._decision = DrainDecision({})
        self._occupied: dict[Slot, str] = {}
        #: (job, host) pairs whose checkpoint order has an event already.
        self._told: set[tuple[str, str]] = set()

    def mark(
        self,
        cluster: ClusterModel,
        host: str,
        now: float,
        *,
        leaves_at: float | None,
        source: DrainSource,
    ) -> HostDrain:
        """Mark ``host`` leaving (stored first); :class:`UnknownHost` if there is none."""
        if cluster.host(host) is None:
            raise UnknownHost(host)
        drain = self.store.mark_draining(host, now, leaves_at=leaves_at, source=source)
        with self._lock:
            self._drains[host] = drain
        log.info("host %s draining (%s, leaves at %s)", host, source.value, drain.leaves_at)
        return drain

    def unmark(self, host: str, now: float) -> bool:
        """Take ``host`` back into service; ``False`` when it was not draining."""
        back = self.store.unmark_draining(host, now)
        with self._lock:
            self._drains.pop(host, None)
            self._told = {(j, h) for j, h in self._told if h != host}
        return back

    def covers(self, host: str, leaves_at: float | None) -> bool:
        """Whether ``host`` drains already, by ``leaves_at`` or earlier (a notice that
        would change nothing)."""
        with self._lock:
            drain = self._drains.get(host)
        if drain is None:
            return False
        return leaves_at is None or (drain.leaves_at is not None and drain.leaves_at <= leaves_at)

    def drains(self) -> dict[str, HostDrain]:
        """Every draining host, by name."""
        with self._lock:
            return dict(self._drains)

    def policy_cluster(self, cluster: ClusterModel) -> Cluster:
        """The policy's view of ``cluster``, its draining hosts marked leaving."""
        drains = self.drains()
        return cluster.to_policy(leaving={h: d.leaves_at for h, d in drains.items()})

    def record(self, decision: DrainDecision, occupied: Mapping[Slot, str], now: float) -> None:
        """Keep what the tick decided and which slots live workers hold; tell each job
        once that it checkpoints before its host goes (an event of the job)."""
        with self._lock:
            self._decision = decision
            self._occupied = dict(occupied)
            new = [o for o in decision.checkpoints if (o.job_id, o.host) not in self._told]
            self._told.update((o.job_id, o.host) for o in new)
        for order in new:
            message = (
                f"cannot leave host {order.host} in place (no room elsewhere): checkpoints "
                f"in {max(0.0, order.at - now):.0f}s, before the host goes in "
                f"{max(0.0, order.deadline - now):.0f}s, and resumes elsewhere"
            )
            data = {"host": order.host, "at": order.at, "deadline": order.deadline}
            self.store.add_event(order.job_id, "drain-checkpoint", message, data, now=now)

    def state(self, host: str) -> DrainState | None:
        """What is still on ``host`` while it drains (``None``: it is not draining)."""
        with self._lock:
            drain = self._drains.get(host)
            if drain is None:
                return None
            remaining = sorted({job for slot, job in self._occupied.items() if slot[0] == host})
            orders = tuple(o for o in self._decision.checkpoints if o.host == host)
        return DrainState(drain, tuple(remaining), orders)
