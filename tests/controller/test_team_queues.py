"""Team queues on a real server: the loan and its reclaim as job events, ``GET /queues``,
``tidal queues``, the per-team gauges, and a teams file refused at start by field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.controller.conftest import Served, serve
from tidal.cli.main import controller_app, run_app
from tidal.controller.cluster import ClusterModel
from tidal.policy.fairshare import FairSharePolicy
from tidal.server.process import team_policy
from tidal.spec import parse_spec
from tidal.wire.schema import AllocationView
from tidal.wire.teams_file import parse_teams

TEAMS = {"teams": [{"name": "a", "guaranteed": 4}, {"name": "b", "guaranteed": 4}]}


@pytest.fixture
def teams_served(tmp_path: Path) -> Iterator[Served]:
    """A server of 8 slots whose fairshare is shared over teams a and b (4 each)."""
    cluster = ClusterModel.single(8, name="h")
    policy = team_policy(FairSharePolicy(), parse_teams(TEAMS), cluster)
    with serve(tmp_path, cluster, policy) as served:
        yield served


def spec(name: str, team: str, workers: str) -> dict[str, object]:
    return {"name": name, "command": ["python", "train.py"], "workers": workers, "team": team}


def test_a_loan_is_reclaimed_by_shrinking_and_said_on_both_sides(
    teams_served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    client = teams_served.client()
    a = client.submit(spec("a1", "a", "1:8")).id
    teams_served.controller.tick()
    assert client.get(a).team == "a"
    assert len(client.get(a).slots) == 8
    queues = {q.team: q for q in client.queues()}
    assert (queues["a"].used, queues["a"].borrowed, queues["b"].lent) == (8, 4, 4)
    assert [e.message for e in client.events(a) if e.kind == "lent"] == ["lent to team a by team b"]

    b = client.submit(spec("b1", "b", "4")).id
    teams_served.controller.tick()  # a's job shrinks first …
    teams_served.controller.tick()  # … then b's starts on the slots it gave back
    assert (len(client.get(a).slots), len(client.get(b).slots)) == (4, 4)
    assert client.get(a).state != "queued"  # shrunk, not preempted
    assert [e.message for e in client.events(a) if e.kind == "reclaimed"] == [
        "4 slot(s) reclaimed by team b"
    ]
    assert [e.message for e in client.events(b) if e.kind == "reclaimed"] == [
        "reclaimed by team b from team a"
    ]
    queues = {q.team: q for q in client.queues()}
    assert (queues["a"].borrowed, queues["b"].lent, queues["b"].used) == (0, 0, 4)

    auth = {"Authorization": f"Bearer {teams_served.token}"}
    metrics = httpx.get(f"{teams_served.url}/metrics", headers=auth).text
    assert 'tidal_team_slots_used{team="b"} 4.0' in metrics
    assert 'tidal_team_slots_guaranteed{team="a"} 4.0' in metrics
    assert 'tidal_team_slots_borrowed{team="a"} 0.0' in metrics

    code = run_app(
        controller_app, ["queues", "--url", teams_served.url, "--token", teams_served.token]
    )
    out, _ = capsys.readouterr()
    assert code == 0
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert "guaranteed" in lines[0] and "borrowed" in lines[0] and "lent" in lines[0]
    cells = [[c for c in line.replace("│", " ").split()] for line in lines]
    assert ["a", "4", "-", "4", "-", "-"] in cells, out


def usage(served: Served) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {served.token}"}
    response = httpx.get(f"{served.url}/cluster/usage", headers=auth, timeout=10)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def level(allocations: list[AllocationView], job: str, at: float) -> int:
    """The slots ``job`` held at ``at``, by the allocation timeline."""
    held = [a.count for a in allocations if a.job_id == job and a.time <= at]
    return held[-1] if held else 0


def test_each_teams_usage_over_time_is_its_jobs_allocations_against_its_quota(
    teams_served: Served,
) -> None:
    client, ctl = teams_served.client(), teams_served.controller
    a = client.submit(spec("a1", "a", "1:8")).id
    ctl.tick()  # a borrows b's idle guarantee: 8 slots
    b = client.submit(spec("b1", "b", "4")).id
    ctl.tick()
    ctl.tick()  # b took its guarantee back: 4 and 4

    body = usage(teams_served)
    teams = {t["team"]: t for t in body["teams"]}
    assert sorted(teams) == ["a", "b"]
    assert (teams["a"]["guaranteed"], teams["a"]["limit"]) == (4, None)
    assert (teams["b"]["guaranteed"], teams["b"]["limit"]) == (4, None)
    allocations = client.allocations()
    for i, at in enumerate(body["times"]):
        assert teams["a"]["slots"][i] == level(allocations, a, at)
        assert teams["b"]["slots"][i] == level(allocations, b, at)
    a_slots, a_borrowed = teams["a"]["slots"], teams["a"]["borrowed"]
    assert a_slots[0] == 8 and a_borrowed[0] == 4 and teams["b"]["lent"][0] == 4
    assert (a_slots[-1], teams["b"]["slots"][-1]) == (4, 4)
    assert (a_borrowed[-1], teams["b"]["lent"][-1]) == (0, 0)


def test_without_teams_queues_are_empty(served: Served) -> None:
    assert served.client().queues() == []
    served.store.add_job(parse_spec({"name": "j", "command": "x", "workers": 1}))
    served.controller.tick()
    body = usage(served)
    assert len(body["jobs"]) == 1 and body["teams"] == []


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = run_app(controller_app, list(argv))
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("teams:\n  - name: a\n    guaranteed: -1\n", "teams[0].guaranteed"),
        ("teams:\n  - name: a\n    gaurantee: 2\n", "teams[0].gaurantee"),
        ("teams:\n  - {name: a}\n  - {name: a}\n", "teams[1].name: team 'a' is defined twice"),
        (
            "teams:\n  - {name: a, guaranteed: 6}\n  - {name: b, guaranteed: 4}\n",
            "guaranteed quotas add up to 10 slots but the pool has 8: a (6), b (4)",
        ),
    ],
)
def test_a_bad_teams_file_is_refused_at_start_naming_the_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, named: str
) -> None:
    teams = tmp_path / "teams.yaml"
    teams.write_text(text)
    argv = ["server", "--slots", "8", "--teams", str(teams), "--data-dir", str(tmp_path / "d")]
    code, err = run(capsys, *argv)
    assert code == 2
    assert "--teams" in err and named in err, err
