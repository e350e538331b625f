"""API routes the dashboard reads: spec validation with field paths and lines, cluster
utilisation over time, each job's latest metrics."""

from __future__ import annotations

import httpx
import pytest

from tests.controller.conftest import Served
from tidal.spec import SpecError, locate_problems, parse_spec_yaml

BAD_YAML = """\
name: Bad Name
command: python x.py
workers:
  min: 4
  max: 2
resources: {memory: 12Q}
surprise: 1
"""


def _post(served: Served, path: str, **kw: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {served.token}", **kw.pop("headers", {})}  # type: ignore[dict-item]
    return httpx.post(f"{served.url}{path}", headers=headers, timeout=5, **kw)  # type: ignore[arg-type]


def _get(served: Served, path: str) -> httpx.Response:
    return httpx.get(
        f"{served.url}{path}", headers={"Authorization": f"Bearer {served.token}"}, timeout=5
    )


def test_validate_yaml_gives_every_problem_with_its_path_and_line(served: Served) -> None:
    response = _post(
        served, "/jobs/validate", content=BAD_YAML, headers={"Content-Type": "application/yaml"}
    )
    assert response.status_code == 200
    body = response.json()
    assert body["valid"] is False
    found = {p["path"]: (p["line"], p["msg"]) for p in body["problems"]}
    assert found["name"][0] == 1
    assert found["workers.min"] == (4, "must be ≤ workers.max (got 4 > 2)")
    assert found["resources.memory"][0] == 6
    assert found["surprise"] == (7, "unknown field")
    assert {"loc": ["workers", "min"]}.items() <= next(
        p for p in body["problems"] if p["path"] == "workers.min"
    ).items()
    assert served.store.list_jobs() == [], "validating submits nothing"


def test_validate_accepts_a_good_spec_and_json(served: Served) -> None:
    good = _post(
        served,
        "/jobs/validate",
        content="name: ok\ncommand: python x.py\nworkers: 1:4\n",
        headers={"Content-Type": "application/yaml"},
    )
    assert good.json() == {"valid": True, "problems": [], "warnings": []}
    bad = _post(served, "/jobs/validate", json={"name": "ok", "command": [], "workers": "3:1"})
    problems = bad.json()["problems"]
    assert {p["path"] for p in problems} == {"command", "workers.min"}
    assert all(p["line"] is None for p in problems)
    assert served.store.list_jobs() == []


def test_validate_points_at_the_line_of_a_yaml_syntax_error(served: Served) -> None:
    response = _post(
        served,
        "/jobs/validate",
        content="name: x\ncommand: [a\n",
        headers={"Content-Type": "application/yaml"},
    )
    (problem,) = response.json()["problems"]
    assert problem["path"] == ""
    assert problem["msg"].startswith("invalid YAML")
    assert problem["line"] == 3


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        ("name: x\nworkers: 3:1\n", {"command": None, "workers.min": 2}),
        ("name: x\ncommand: [a, 1]\nenv:\n  1BAD: v\n", {"command[1]": 2, "env": 3}),
    ],
)
def test_locate_problems_falls_back_to_the_nearest_written_parent(
    text: str, wanted: dict[str, int | None]
) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec_yaml(text)
    lines = dict(
        zip(
            [p for p, _ in info.value.problems],
            locate_problems(text, info.value.problems),
            strict=True,
        )
    )
    assert lines == wanted


def test_utilisation_sums_every_job_over_time(served: Served) -> None:
    store = served.store
    a = store.add_job(parse_spec_yaml("name: a\ncommand: x\nworkers: 1:4\n"))
    b = store.add_job(parse_spec_yaml("name: b\ncommand: x\nworkers: 1:4\n"))
    store.update_job(a.id, 100.0, slots=[("h", 0), ("h", 1), ("h", 2), ("h", 3)])
    store.update_job(a.id, 110.0, slots=[("h", 0), ("h", 1)])
    store.update_job(b.id, 110.0, slots=[("h", 2), ("h", 3)])
    store.update_job(a.id, 120.0, slots=[])
    points = _get(served, "/cluster/utilisation").json()
    assert [(p["time"], p["used"], p["total"]) for p in points] == [
        (100.0, 4, 4),
        (110.0, 4, 4),
        (120.0, 2, 4),
    ]
    since = _get(served, "/cluster/utilisation?since=115").json()
    assert [(p["time"], p["used"]) for p in since] == [(115.0, 4), (120.0, 2)]


def test_progress_is_each_jobs_latest_metrics(served: Served) -> None:
    c = served.client()
    a = c.submit({"name": "a", "command": "x"})
    b = c.submit({"name": "b", "command": "x"})
    c.submit({"name": "quiet", "command": "x"})
    c.report_metrics(a.id, 1, {"loss": 2.0})
    c.report_metrics(a.id, 2, {"loss": 1.0, "progress": 0.5})
    c.report_metrics(b.id, 7, {"accuracy": 0.9})
    latest = {p["job_id"]: (p["step"], p["values"]) for p in _get(served, "/progress").json()}
    assert latest == {a.id: (2, {"loss": 1.0, "progress": 0.5}), b.id: (7, {"accuracy": 0.9})}
