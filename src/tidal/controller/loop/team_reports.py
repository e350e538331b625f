"""What a team-queue decision leaves behind: job events saying why, per-team gauges, and
the standing ``GET /queues`` serves.

The policy says why a job's slots moved between teams (:class:`TeamNote`) on every tick
the move is pending; each reason is recorded once per job, when it first appears.
"""

from __future__ import annotations

import logging

from tidal.controller.prometheus import ControllerMetrics
from tidal.controller.store.jobs import JobStore
from tidal.policy.api import Policy
from tidal.policy.team_queues import TeamQueues
from tidal.policy.teams import TeamUsage

__all__ = ["TeamReports"]

log = logging.getLogger(__name__)


class TeamReports:
    """Records the reasons of a :class:`TeamQueues` policy's latest decision."""

    def __init__(self, store: JobStore, metrics: ControllerMetrics) -> None:
        self.store = store
        self.metrics = metrics
        #: Each team's standing after the latest decision; empty without team queues.
        self.usage: tuple[TeamUsage, ...] = ()
        self._said: dict[str, str] = {}

    def record(self, policy: Policy) -> None:
        """Record what ``policy`` decided last, when it is a :class:`TeamQueues`."""
        decision = policy.last if isinstance(policy, TeamQueues) else None
        if decision is None:
            return
        self.usage = decision.usage
        for note in decision.notes:
            if self._said.get(note.job_id) != note.message:
                self._said[note.job_id] = note.message
                self.store.add_event(note.job_id, note.kind, note.message)
        # Only jobs the policy still sees can be noted again.
        live = set(decision.allocation) | {n.job_id for n in decision.notes}
        self._said = {job: said for job, said in self._said.items() if job in live}
        for usage in decision.usage:
            self.metrics.team_slots(usage)
