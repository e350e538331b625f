"""``GET /cluster/usage``: every job's slots over time as aligned step series, the
cluster's utilisation at the same times, priority changes and rescales marked; from the
allocation timeline and events a real store records, through a real API server."""

from __future__ import annotations

import httpx

from tests.controller.conftest import Served
from tidal.controller.routes.usage import team_series
from tidal.controller.store.records import Event
from tidal.policy.teams import TeamUsage
from tidal.spec import parse_spec_yaml
from tidal.wire.usage import UsageSeries, UsageView


def _usage(served: Served, query: str = "") -> dict[str, object]:
    response = httpx.get(
        f"{served.url}/cluster/usage{query}",
        headers={"Authorization": f"Bearer {served.token}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    data: dict[str, object] = response.json()
    return data


def _scene(served: Served) -> tuple[str, str]:
    store = served.store
    a = store.add_job(parse_spec_yaml("name: a\ncommand: x\nworkers: 1:4\n"))
    b = store.add_job(parse_spec_yaml("name: b\ncommand: x\nworkers: 1:4\n"))
    rescale = Event("rescale", "slots changed")
    store.update_job(a.id, 100.0, slots=[("h", 0), ("h", 1), ("h", 2), ("h", 3)], event=rescale)
    store.add_event(b.id, "priority", "5000 → 10000", now=105.0)
    store.update_job(a.id, 110.0, slots=[("h", 0)], event=rescale)
    store.update_job(b.id, 110.0, slots=[("h", 1), ("h", 2), ("h", 3)], event=rescale)
    store.update_job(a.id, 120.0, slots=[], event=rescale)
    return a.id, b.id


def test_every_job_has_its_slots_at_each_change(served: Served) -> None:
    a, b = _scene(served)
    usage = _usage(served)
    times = usage["times"]
    assert isinstance(times, list)
    assert times[:3] == [100.0, 110.0, 120.0]
    assert times[-1] == usage["until"]  # the last level, held until now
    jobs = {s["job_id"]: s["slots"] for s in usage["jobs"]}  # type: ignore[attr-defined]
    assert jobs == {a: [4, 1, 0, 0], b: [0, 3, 3, 3]}
    assert usage["utilisation"] == [1.0, 1.0, 0.75, 0.75]
    assert usage["total_slots"] == 4
    marks = [(m["time"], m["job_id"], m["kind"]) for m in usage["marks"]]  # type: ignore[attr-defined]
    assert (105.0, b, "priority") in marks
    assert (110.0, a, "rescale") in marks and (110.0, b, "rescale") in marks


def test_since_starts_at_the_level_then(served: Served) -> None:
    a, b = _scene(served)
    usage = _usage(served, "?since=115")
    assert usage["since"] == 115.0
    assert usage["times"][:2] == [115.0, 120.0]  # type: ignore[index]
    jobs = {s["job_id"]: s["slots"][:2] for s in usage["jobs"]}  # type: ignore[attr-defined]
    assert jobs == {a: [1, 0], b: [3, 3]}
    assert [m["time"] for m in usage["marks"]] == [120.0]  # type: ignore[attr-defined]
    # A window after a job ended leaves it out.
    later = _usage(served, "?since=125")
    assert [s["job_id"] for s in later["jobs"]] == [b]  # type: ignore[attr-defined]


def test_a_teams_series_sums_its_jobs_and_counts_loans_against_its_guarantee() -> None:
    view = UsageView(
        since=0.0,
        until=20.0,
        total_slots=8,
        times=[0.0, 10.0, 20.0],
        jobs=[
            UsageSeries(job_id="a1", slots=[2, 4, 4]),
            UsageSeries(job_id="a2", slots=[2, 2, 0]),
            UsageSeries(job_id="x1", slots=[0, 2, 4]),
            UsageSeries(job_id="gone", slots=[1, 1, 1]),
        ],
        utilisation=[0.5, 1.0, 1.0],
        marks=[],
    )
    standing = [
        TeamUsage("a", guaranteed=4, limit=6, used=0, borrowed=0, lent=0),
        TeamUsage("b", guaranteed=4, limit=None, used=0, borrowed=0, lent=0),
    ]
    # x1's team is in no teams file; "gone" is no longer in the store: not counted.
    teams = {t.team: t for t in team_series(view, {"a1": "a", "a2": "a", "x1": "x"}, standing)}
    assert sorted(teams) == ["a", "b", "x"]
    assert (teams["a"].slots, teams["a"].borrowed, teams["a"].lent) == (
        [4, 6, 4],
        [0, 2, 0],
        [0] * 3,
    )
    # b's idle guarantee is what a and x borrow beyond the slots nobody is guaranteed (none).
    assert (teams["b"].slots, teams["b"].lent) == ([0, 0, 0], [0, 4, 4])
    assert (teams["x"].guaranteed, teams["x"].limit, teams["x"].borrowed) == (0, None, [0, 2, 4])
    assert (teams["a"].guaranteed, teams["a"].limit) == (4, 6)
    assert team_series(view, {"a1": "a"}, []) == []  # no team queues: no series
