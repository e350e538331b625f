"""The cluster page's team charts in a real browser (Debian's Chromium, driven by
Playwright) against a real API server whose policy is shared over two teams' queues: one
chart per team, its guarantee and limit drawn as lines, its slots over time those of its
jobs' allocations, what it borrowed and lent beside them; seen by a viewer of the other
team as by an admin. The fake backend runs the jobs; the test ticks the loop."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.controller.conftest import Served, serve
from tests.dashboard import chromium
from tests.dashboard.chromium import Page, expect, log_in, shot
from tidal.controller.cluster import ClusterModel
from tidal.policy.fairshare import FairSharePolicy
from tidal.server.process import team_policy
from tidal.wire.schema import AllocationView
from tidal.wire.teams_file import parse_teams

# The real browser (skipped, saying why, where there is none outside CI).
browser = chromium.browser
page = chromium.page

#: Team a may hold 6 of the 8 slots at most; b has no limit.
TEAMS = {
    "teams": [
        {"name": "a", "guaranteed": 4, "hard_limit": 6},
        {"name": "b", "guaranteed": 4},
    ]
}


@pytest.fixture
def teams_served(tmp_path: Path) -> Iterator[Served]:
    """A server of 8 slots whose fairshare is shared over teams a and b."""
    cluster = ClusterModel.single(8, name="h")
    policy = team_policy(FairSharePolicy(), parse_teams(TEAMS), cluster)
    with serve(tmp_path, cluster, policy) as served:
        yield served


def spec(name: str, team: str, workers: str) -> dict[str, object]:
    return {"name": name, "command": ["python", "train.py"], "workers": workers, "team": team}


def level(allocations: list[AllocationView], job: str, at: float) -> int:
    """The slots ``job`` held at ``at``, by the allocation timeline."""
    held = [a.count for a in allocations if a.job_id == job and a.time <= at]
    return held[-1] if held else 0


def points(page: Page, team: str) -> list[list[float]]:
    """The columns team ``team``'s chart draws."""
    chart = page.locator(f'.team-block[data-team="{team}"] .chart')
    found: list[list[float]] = json.loads(chart.get_attribute("data-points") or "[]")
    return found


def test_each_team_has_a_chart_of_its_slots_against_its_guarantee_and_limit(
    teams_served: Served, page: Page
) -> None:
    ctl = teams_served.controller
    with teams_served.client() as client:
        a = client.submit(spec("a1", "a", "1:8")).id
        ctl.tick()  # a borrows 2 of b's idle guarantee, up to its limit of 6
        assert len(client.get(a).slots) == 6
        b = client.submit(spec("b1", "b", "4")).id
        ctl.tick()  # a gives the loan back …
        ctl.tick()  # … and b starts on its guarantee
        assert (len(client.get(a).slots), len(client.get(b).slots)) == (4, 4)
        client.add_user("vic", role="viewer", team="b")
        viewer = client.create_token("browser", user="vic").token
        allocations = client.allocations()

    # The data: each team's slots are its jobs' allocations at every time of the view.
    auth = {"Authorization": f"Bearer {viewer}"}
    body: dict[str, Any] = httpx.get(
        f"{teams_served.url}/cluster/usage", headers=auth, timeout=10
    ).json()
    teams = {t["team"]: t for t in body["teams"]}
    assert sorted(teams) == ["a", "b"]
    for i, at in enumerate(body["times"]):
        assert teams["a"]["slots"][i] == level(allocations, a, at)
        assert teams["b"]["slots"][i] == level(allocations, b, at)
    assert (teams["a"]["guaranteed"], teams["a"]["limit"]) == (4, 6)
    assert (teams["b"]["guaranteed"], teams["b"]["limit"]) == (4, None)
    assert (teams["a"]["slots"][0], teams["a"]["borrowed"][0], teams["b"]["lent"][0]) == (6, 2, 2)

    # A viewer of team b sees both teams' charts, as every user sees the cluster.
    log_in(page, teams_served.url, viewer)
    page.goto(f"{teams_served.url}/#/cluster")
    expect(page.locator("#team-card")).to_be_visible()
    expect(page.locator("#team-charts .team-block")).to_have_count(2)
    # A viewer may not drain: the hosts have no Drain button.
    expect(page.locator('.host-row[data-host="h"]')).to_be_visible()
    expect(page.locator("button.drain")).to_have_count(0)
    block_a = page.locator('.team-block[data-team="a"]')
    block_b = page.locator('.team-block[data-team="b"]')
    expect(block_a.locator("h3")).to_have_text("a")
    expect(block_a.locator(".team-now")).to_have_text(
        "4 used · guarantee 4 · limit 6 · borrowed 0 · lent 0"
    )
    expect(block_b.locator(".team-now")).to_contain_text("4 used · guarantee 4 · no limit")
    # uPlot drew time, used, guaranteed, limit, borrowed and lent; b has no limit line.
    legend_a = block_a.locator(".u-legend .u-series")
    expect(legend_a).to_have_count(6)
    expect(legend_a.nth(2)).to_contain_text("guaranteed")
    expect(legend_a.nth(3)).to_contain_text("limit")
    expect(block_b.locator(".u-legend .u-series")).to_have_count(5)

    xs, used, guaranteed, limit, borrowed, lent = points(page, "a")
    assert set(guaranteed) == {4} and set(limit) == {6}
    assert used == [level(allocations, a, x) for x in xs]
    assert (used[0], borrowed[0], used[-1], borrowed[-1]) == (6, 2, 4, 0)
    assert set(lent) == {0}
    xs, used, guaranteed, borrowed, lent = points(page, "b")
    assert set(guaranteed) == {4}
    assert used == [level(allocations, b, x) for x in xs]
    assert (lent[0], lent[-1], used[-1]) == (2, 0, 4)
    shot(page, "cluster-teams")
    # A narrow window: one team's chart to a row, each as wide as the card.
    page.set_viewport_size({"width": 640, "height": 900})
    expect(block_b).to_be_visible()
    box_a, box_b = block_a.bounding_box(), block_b.bounding_box()
    assert box_a is not None and box_b is not None and box_b["y"] > box_a["y"]
    shot(page, "cluster-teams-narrow")


def test_without_teams_the_team_card_stays_hidden(served: Served, page: Page) -> None:
    with served.client() as client:
        client.submit({"name": "j", "command": "x", "workers": 1})
    served.controller.tick()
    log_in(page, served.url, served.token)
    page.goto(f"{served.url}/#/cluster")
    expect(page.locator("#usage-legend .usage-band")).to_have_count(1)
    expect(page.locator("#team-card")).to_be_hidden()
