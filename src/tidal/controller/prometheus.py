"""Prometheus metrics the controller keeps and ``GET /metrics`` serves
(:mod:`tidal.controller.routes.prometheus`)."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from tidal.policy.teams import TeamUsage

__all__ = ["ControllerMetrics"]

#: Rescales take from well under a second (a step boundary) to minutes (a newcomer that
#: must start Python and import torch first).
_STALL_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class ControllerMetrics:
    """The controller's gauges, counters and histograms in a registry of their own.

    A registry per controller (not the process-global one) lets several controllers live in
    one process, as they do in tests.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.slots_total = Gauge(
            "tidal_slots_total", "Slots in the cluster.", registry=self.registry
        )
        self.slots_used = Gauge(
            "tidal_slots_used", "Slots allocated to jobs.", registry=self.registry
        )
        self.jobs = Gauge("tidal_jobs", "Jobs by state.", ["state"], registry=self.registry)
        self.rescales = Counter(
            "tidal_rescales", "Rescales the controller asked for.", registry=self.registry
        )
        self.rescale_stall = Histogram(
            "tidal_rescale_stall_seconds",
            "From asking a job to rescale until all its workers run on the new slots.",
            buckets=_STALL_BUCKETS,
            registry=self.registry,
        )
        self.ticks = Counter(
            "tidal_controller_ticks", "Controller loop ticks.", registry=self.registry
        )
        self.tick_failures = Counter(
            "tidal_controller_tick_failures",
            "Controller loop ticks that failed (a full disk, the database down, an error).",
            registry=self.registry,
        )

        team = ["team"]
        self.team_used = Gauge(
            "tidal_team_slots_used", "Slots a team's jobs hold.", team, registry=self.registry
        )
        self.team_guaranteed = Gauge(
            "tidal_team_slots_guaranteed",
            "Slots guaranteed to a team.",
            team,
            registry=self.registry,
        )
        self.team_borrowed = Gauge(
            "tidal_team_slots_borrowed",
            "Slots a team holds above its guarantee.",
            team,
            registry=self.registry,
        )
        self.team_lent = Gauge(
            "tidal_team_slots_lent",
            "Slots of a team's guarantee that other teams hold.",
            team,
            registry=self.registry,
        )

    def team_slots(self, usage: TeamUsage) -> None:
        """Set one team's gauges."""
        self.team_used.labels(usage.team).set(usage.used)
        self.team_guaranteed.labels(usage.team).set(usage.guaranteed)
        self.team_borrowed.labels(usage.team).set(usage.borrowed)
        self.team_lent.labels(usage.team).set(usage.lent)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
