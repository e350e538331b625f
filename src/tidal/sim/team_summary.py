"""Per-team figures of a simulation with team queues: completion times, slots held and
borrowed, and how often each team's guarantee was honoured when it asked for it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tidal.policy.teams import Team
from tidal.sim.engine import SimResult
from tidal.sim.workload import WorkloadJob

__all__ = ["TeamSummary", "team_summaries"]


@dataclass(frozen=True)
class TeamSummary:
    """One team's figures over a run (times in seconds, slots averaged over decisions)."""

    team: str
    guaranteed: int
    jobs: int
    finished: int
    avg_jct: float
    mean_used: float
    mean_borrowed: float
    #: Decisions at which the team's unfinished jobs asked for slots …
    asked: int
    #: … and those at which it held at least its guarantee, or all it asked if less.
    honoured: int

    @property
    def honoured_share(self) -> float:
        """Share of the decisions it asked at where its guarantee was honoured (1 if none)."""
        return self.honoured / self.asked if self.asked else 1.0


def team_summaries(
    result: SimResult, workload: Sequence[WorkloadJob], teams: Sequence[Team]
) -> list[TeamSummary]:
    """Each team's figures, the configured teams first, then the others by name.

    What a team asks for at a decision is the sum of its unfinished jobs' requested sizes
    (``num_replicas``): what an elastic policy such as ``fairshare`` grows them to.
    """
    team_of = {job.name: job.team for job in workload}
    asked_by = {job.name: job.num_replicas for job in workload}
    guarantee = {t.name: t.total_guaranteed for t in teams}
    names = [t.name for t in teams] + sorted(set(team_of.values()) - set(guarantee))
    # Submissions and finishes in time order, walked once alongside the decisions.
    arrivals = sorted((j.submit_time, j.name) for j in result.jobs)
    departures = sorted((j.finish_time, j.name) for j in result.jobs if j.finish_time is not None)
    asking = dict.fromkeys(names, 0)
    used_sum = dict.fromkeys(names, 0.0)
    borrowed_sum = dict.fromkeys(names, 0.0)
    asked = dict.fromkeys(names, 0)
    honoured = dict.fromkeys(names, 0)
    a = d = 0
    for time, held in result.timeline:
        while a < len(arrivals) and arrivals[a][0] <= time:
            name = arrivals[a][1]
            asking[team_of[name]] += asked_by[name]
            a += 1
        while d < len(departures) and departures[d][0] <= time:
            name = departures[d][1]
            asking[team_of[name]] -= asked_by[name]
            d += 1
        used = dict.fromkeys(names, 0)
        for job, slots in held.items():
            used[team_of[job]] += slots
        for team in names:
            g = guarantee.get(team, 0)
            used_sum[team] += used[team]
            borrowed_sum[team] += max(0, used[team] - g)
            if asking[team] > 0:
                asked[team] += 1
                honoured[team] += used[team] >= min(g, asking[team])
    decisions = max(1, len(result.timeline))
    summaries = []
    for team in names:
        jobs = [j for j in result.jobs if team_of[j.name] == team]
        jcts = [j.jct for j in jobs if j.jct is not None]
        summaries.append(
            TeamSummary(
                team=team,
                guaranteed=guarantee.get(team, 0),
                jobs=len(jobs),
                finished=len(jcts),
                avg_jct=sum(jcts) / len(jcts) if jcts else float("nan"),
                mean_used=used_sum[team] / decisions,
                mean_borrowed=borrowed_sum[team] / decisions,
                asked=asked[team],
                honoured=honoured[team],
            )
        )
    return summaries
