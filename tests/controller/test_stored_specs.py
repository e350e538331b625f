"""Specs an earlier release stored under more lenient rules still load: strict rules apply
to new input only. Each fixture row (``fixtures/lenient_specs.json``, JSON as the store
writes it, ``Infinity`` included) is put in a store as that release wrote it; the job
shows, is listed readable, goes through the controller loop and can be cancelled, while
the same spec submitted today is refused."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from tests.controller.conftest import Served
from tidal.controller.store.stored_specs import load_stored_spec, relax

ROWS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "fixtures" / "lenient_specs.json").read_text()
)


def _as_json(value: Any) -> Any:
    """``value`` as a JSON answer carries it: a non-finite number is ``null``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_json(v) for v in value]
    return value


def _store_as_earlier_release(served: Served, spec: dict[str, Any]) -> str:
    """A job row holding ``spec`` exactly (and its name column), as an earlier release
    that accepted it wrote it."""
    job = served.store.add_job(
        load_stored_spec({"name": "placeholder", "command": ["python", "train.py"]})
    )
    with served.store.engine.begin() as conn:
        conn.execute(
            text("UPDATE jobs SET spec = :spec, name = :name WHERE id = :id"),
            {"spec": json.dumps(spec), "name": spec["name"], "id": job.id},
        )
    return job.id


@pytest.mark.parametrize("row", ROWS, ids=[r["spec"]["name"].strip() for r in ROWS])
def test_a_leniently_stored_spec_shows_runs_and_cancels(
    served: Served, row: dict[str, Any]
) -> None:
    spec = row["spec"]
    headers = {"Authorization": f"Bearer {served.token}"}
    with httpx.Client(base_url=served.url, headers=headers, timeout=30) as http:
        # Today's rules refuse it as new input ...
        refused = http.post(
            "/jobs", content=json.dumps(spec), headers={"Content-Type": "application/json"}
        )
        assert refused.status_code == 422, refused.text
        # ... but the stored job loads.
        job_id = _store_as_earlier_release(served, spec)
        shown = http.get(f"/jobs/{job_id}")
        assert shown.status_code == 200, shown.text
        assert shown.json()["spec"] == _as_json(spec)  # as stored, unchanged
        listed = http.get("/jobs").json()
        assert [j["state"] for j in listed if j["id"] == job_id] == ["queued"]
        served.controller.tick()  # the loop reads the job's model from the stored spec
        assert http.get(f"/jobs/{job_id}").json()["state"] in ("queued", "running")
        assert http.post(f"/jobs/{job_id}/cancel").status_code == 202
        served.controller.tick()
        ended = http.get(f"/jobs/{job_id}").json()
        assert ended["state"] == "cancelled", ended["reason"]


def test_relax_reads_values_as_earlier_rules_did() -> None:
    numbers, named, infinite = (load_stored_spec(r["spec"]) for r in ROWS)
    assert (numbers.workers.min, numbers.workers.max, numbers.workers.initial) == (1, 2, 2)
    assert numbers.priority == 7
    assert (numbers.resources.gpus, numbers.resources.cpus, numbers.resources.memory) == (
        0,
        2.0,
        1,
    )
    assert numbers.restart.max_restarts == 5
    assert numbers.checkpoint_every_steps == 10
    assert named.name == "legacy-text"
    assert named.env == {"SEED": "1"}
    assert infinite.checkpoint_every_seconds == 0.0  # never, by time: off
    assert infinite.resources.cpus is not None
    assert infinite.resources.cpus > 1000
    # A strictly valid spec is taken as it is; relax leaves it alone.
    valid = {"name": "ok", "command": ["x"], "priority": 5}
    assert relax(valid) == valid


def test_a_spec_no_rules_ever_accepted_is_still_refused() -> None:
    with pytest.raises(ValueError, match="name"):
        load_stored_spec({"name": "Bad Name!", "command": ["x"]})


def test_a_spec_no_release_accepted_stops_only_its_own_job(served: Served) -> None:
    """A row edited into a spec nothing can read: the loop leaves that job alone (it can
    still be cancelled) and goes on with the others."""
    headers = {"Authorization": f"Bearer {served.token}"}
    with httpx.Client(base_url=served.url, headers=headers, timeout=30) as http:
        broken = _store_as_earlier_release(served, {"name": "Bad Name!", "command": ["x"]})
        fine = http.post("/jobs", json={"name": "fine", "command": ["x"]}).json()["id"]
        served.controller.tick()
        assert http.get(f"/jobs/{fine}").json()["state"] == "running"
        assert http.get(f"/jobs/{broken}").json()["state"] == "queued"
        assert http.post(f"/jobs/{broken}/cancel").status_code == 202
        served.controller.tick()
        assert http.get(f"/jobs/{broken}").json()["state"] == "cancelled"
