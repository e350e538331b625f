"""The REST API through a real uvicorn server on loopback."""

from __future__ import annotations

import os
import stat
import threading

import httpx
import pytest

from tests.controller.conftest import Served
from tests.controller.fakes import PS_JOB
from tidal.client import AuthError, Conflict, InvalidRequest
from tidal.controller.routes.auth import ensure_token, read_token
from tidal.wire.schema import JobView

SPEC = {"name": "mnist", "command": "python train.py", "workers": "1:4"}


def snapshot(served: Served) -> tuple[object, ...]:
    return (served.store.list_jobs(), served.store.events(), served.store.allocations())


def test_health_is_public_and_openapi_is_served(served: Served) -> None:
    assert httpx.get(f"{served.url}/health", timeout=5).json()["status"] == "ok"
    paths = httpx.get(f"{served.url}/openapi.json", timeout=30).json()["paths"]
    assert {"/jobs", "/jobs/{ref}/scale-out", "/metrics", "/cluster"} <= set(paths)


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic abc", "Bearer x"])
def test_requests_without_the_token_get_401_and_change_nothing(
    served: Served, header: str | None
) -> None:
    job = served.client().submit(SPEC)
    before = snapshot(served)
    headers = {"Authorization": header} if header else {}
    with httpx.Client(base_url=served.url, headers=headers, timeout=5) as http:
        responses = [
            http.post("/jobs", json={**SPEC, "name": "intruder"}),
            http.put(f"/jobs/{job.id}/priority", json={"priority": 9}),
            http.post(f"/jobs/{job.id}/cancel"),
            http.post(f"/jobs/{job.id}/scale", json={"workers": 2}),
            http.get("/jobs"),
            http.get("/metrics"),
            http.get(f"/jobs/{job.id}/logs"),
        ]
    assert [r.status_code for r in responses] == [401] * len(responses)
    assert responses[0].headers["www-authenticate"] == "Bearer"
    assert snapshot(served) == before


def test_client_with_wrong_token_raises(served: Served) -> None:
    with pytest.raises(AuthError):
        served.client().__class__(url=served.url, token="nope").list()


def test_bad_spec_is_422_with_every_field_path(served: Served) -> None:
    bad = {"name": "x", "command": [], "workers": {"min": 4, "max": 2}, "priority": "high"}
    response = httpx.post(
        f"{served.url}/jobs",
        json=bad,
        headers={"Authorization": f"Bearer {served.token}"},
        timeout=5,
    )
    assert response.status_code == 422
    paths = {d["path"] for d in response.json()["detail"]}
    assert paths == {"command", "workers.min", "priority"}
    assert served.store.list_jobs() == []
    with pytest.raises(InvalidRequest) as info:
        served.client().submit("name: x\ncommand: [a]\nworkers: 3:1\n")
    assert info.value.problems == [("workers.min", "must be ≤ workers.max (got 3 > 1)")]


def test_submit_list_get_priority_cancel(served: Served) -> None:
    c = served.client()
    a = c.submit({**SPEC, "workers": 3})
    b = c.submit("name: other\ncommand: python x.py\nlabels: {team: nlp}\n")
    assert a.state == "queued"
    assert a.spec is not None
    assert a.spec["command"] == ["python", "train.py"]
    assert [j.id for j in c.list()] == [a.id, b.id]
    assert [j.id for j in c.list(labels={"team": "nlp"})] == [b.id]
    assert [j.id for j in c.list(name="mnist")] == [a.id]
    served.controller.tick()
    assert [j.id for j in c.list(state="running")] == [a.id, b.id]
    got = c.get(a.id)
    assert got.workers == 3 and got.state == "running"
    assert c.get("mnist").id == a.id  # by name
    asked = c.priority(a.id, 9000)
    assert asked.priority == 9000
    assert [r.kind for r in asked.pending_requests] == ["priority"]
    # The API records the request; the loop, the only writer of desired state, applies it.
    assert served.store.get_job(a.id).priority == 5000  # type: ignore[union-attr]
    served.controller.tick()
    assert served.store.get_job(a.id).priority == 9000  # type: ignore[union-attr]
    assert c.get(a.id).pending_requests == []
    assert c.cancel(a.id).cancel_requested
    served.controller.tick()
    assert c.wait(a.id, timeout=5).state == "cancelled"
    with pytest.raises(Conflict):
        c.priority(a.id, 1)
    kinds = [e.kind for e in c.events(a.id)]
    assert kinds[:2] == ["submitted", "started"] and "priority" in kinds
    assert kinds[-1] == "cancelled"


def test_a_request_the_loop_applies_while_the_api_answers_is_in_the_answer(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop may apply a request between the API storing it and reading it back: the
    answer (and any view read meanwhile) still shows the requested value."""
    c = served.client()
    a = c.submit({**SPEC, "priority": 7000})
    served.controller.tick()
    store = served.store
    read_pending = store.pending_requests
    ticking = threading.Event()

    def loop_runs_first(job_ids: object = None) -> object:
        # The controller's own read (inside its tick) must not tick again. The tick runs
        # in a thread of its own, as the loop's does: the API's reads may share one
        # transaction (a snapshot), which the loop's writes are not part of.
        if not ticking.is_set():
            ticking.set()
            try:
                # applies and deletes the pending requests
                loop = threading.Thread(target=served.controller.tick)
                loop.start()
                loop.join(30)
                assert not loop.is_alive()
            finally:
                ticking.clear()
        return read_pending(job_ids)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "pending_requests", loop_runs_first)
    assert c.priority(a.id, 9000).priority == 9000
    assert store.get_job(a.id).priority == 9000  # type: ignore[union-attr]  # applied
    assert c.scale(a.id, 2).target_slots == 2
    assert c.get(a.id).target_slots == 2
    assert c.scale(a.id, 3).target_slots == 3
    assert [j.target_slots for j in c.list()] == [3]


def test_slot_counts_are_served_under_their_former_names_too(served: Served) -> None:
    c = served.client()
    a = c.submit(SPEC)
    c.scale(a.id, 2)
    response = httpx.get(
        f"{served.url}/jobs/{a.id}",
        headers={"Authorization": f"Bearer {served.token}"},
        timeout=5,
    )
    body = response.json()
    assert (body["min_slots"], body["max_slots"], body["target_slots"]) == (1, 4, 2)
    # Deprecated, for one release: the same values under the former names.
    assert (body["min_workers"], body["max_workers"], body["target_workers"]) == (1, 4, 2)
    (pending,) = body["pending_requests"]
    assert (pending["data"]["target_slots"], pending["data"]["workers"]) == (2, 2)
    schema = httpx.get(f"{served.url}/openapi.json", timeout=30).json()
    fields = schema["components"]["schemas"]["JobView"]["properties"]
    assert fields["target_workers"]["deprecated"] is True
    assert "deprecated" not in fields["target_slots"]
    # A view from a server of the release before (former names only) reads the same.
    old = {k: v for k, v in body.items() if not k.endswith("_slots")}
    assert JobView.model_validate(old).target_slots == 2


def test_scale_and_rollback_fields(served: Served) -> None:
    c = served.client()
    a = c.submit(SPEC)
    served.controller.tick()
    assert c.scale(a.id, 2).target_slots == 2
    with pytest.raises(InvalidRequest) as info:
        c.scale(a.id, 9)
    assert info.value.problems[0][0] == "workers"
    served.controller.tick()
    served.controller.tick()
    assert c.get(a.id).workers == 2
    grown = c.scale_out(a.id, 1, timeout_s=30)
    assert grown.target_slots == 3 and grown.scale_deadline is not None
    with pytest.raises(InvalidRequest, match="above the job's max"):
        c.scale_out(a.id, 5)
    assert c.scale_in(a.id, 1).target_slots == 1
    with pytest.raises(InvalidRequest, match="below the job's min"):
        c.scale_in(a.id, 2)
    served.controller.tick()
    assert [x.count for x in c.allocations(a.id)] == [4, 2, 1]


def test_logs_tail_and_follow(served: Served) -> None:
    c = served.client()
    a = c.submit({**SPEC, "workers": 2})
    served.controller.tick()
    text = c.logs(a.id, tail=2)
    assert text.splitlines() == [
        "[0] worker 0 line 3",
        "[0] worker 0 line 4",
        "[1] worker 1 line 3",
        "[1] worker 1 line 4",
    ]
    assert c.logs(a.id, tail=1, worker=1) == "[1] worker 1 line 4\n"
    path = served.backend.log_paths(a.id)[0]
    lines: list[str] = []
    streaming = threading.Event()

    def follow() -> None:
        for line in c.follow_logs(a.id, tail=1, worker=0):
            lines.append(line)
            streaming.set()

    reader = threading.Thread(target=follow)
    reader.start()
    assert streaming.wait(10)
    with path.open("a") as f:
        f.write("fresh line\n")
    served.backend.finish(a.id)
    served.controller.tick()
    reader.join(10)
    assert not reader.is_alive()
    assert lines == ["[0] worker 0 line 4", "[0] fresh line"]
    # The backend has forgotten the finished job; its logs are still there to read.
    assert a.id not in served.backend.jobs
    assert c.logs(a.id, tail=1, worker=0) == "[0] fresh line\n"


def test_cluster_and_metrics(served: Served) -> None:
    c = served.client()
    a = c.submit({**SPEC, "workers": 3})
    served.controller.tick()
    view = c.cluster()
    assert (view.total_slots, view.used_slots, view.policy) == (4, 3, "greedy")
    assert view.hosts[0].used_by == [a.id, a.id, a.id, None]
    text = httpx.get(
        f"{served.url}/metrics", headers={"Authorization": f"Bearer {served.token}"}, timeout=5
    ).text
    assert "tidal_slots_used 3.0" in text
    assert "tidal_rescale_stall_seconds_bucket" in text


def test_unknown_job_is_404(served: Served) -> None:
    r = httpx.get(
        f"{served.url}/jobs/nope", headers={"Authorization": f"Bearer {served.token}"}, timeout=5
    )
    assert r.status_code == 404


def test_token_file_is_private_and_stable(served: Served) -> None:
    path = served.data_dir / "token"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_token(served.data_dir) == served.token
    assert ensure_token(served.data_dir) == served.token


def test_training_metrics_round_trip(served: Served) -> None:
    c = served.client()
    a = c.submit(SPEC)
    c.report_metrics(a.id, 20, {"loss": 0.5, "accuracy": 0.8})
    c.report_metrics(a.id, 10, {"loss": 0.9})
    assert [(m.step, m.values["loss"]) for m in c.metrics(a.id)] == [(10, 0.9), (20, 0.5)]
    with pytest.raises(InvalidRequest) as info:
        c.report_metrics(a.id, 30, {})
    assert info.value.problems[0][0] == "values"


def test_job_views_show_the_goodput_report(served: Served) -> None:
    c = served.client()
    a = c.submit(SPEC)
    assert c.get(a.id).batch_size is None
    (before,) = c.list()  # the listing keeps this view until the job changes
    assert before.batch_size is None
    served.store.set_goodput(
        a.id, {"batch_size": 256, "efficiency": 0.8, "speedup": 3.2, "model": {}}
    )
    view = c.get(a.id)
    assert (view.batch_size, view.efficiency, view.speedup) == (256, 0.8, 3.2)
    assert view.goodput is not None and view.goodput["batch_size"] == 256
    (listed,) = c.list()
    assert (listed.batch_size, listed.efficiency, listed.speedup) == (256, 0.8, 3.2)


def test_scale_by_role_counts_that_roles_replicas(served: Served) -> None:
    c = served.client()
    job = c.submit(PS_JOB)
    served.controller.tick()
    assert c.get(job.id).workers == 4  # 2 servers, and the slots left: 2 workers
    # Two workers of the elastic role: the job asks for them plus its two servers.
    asked = c.scale(job.id, 2, role="worker")
    assert asked.target_slots == 4
    served.controller.tick()
    served.controller.tick()
    assert c.get(job.id).workers == 4
    assert c.scale(job.id, 1, role="worker").target_slots == 3
    served.controller.tick()
    served.controller.tick()
    assert c.get(job.id).workers == 3
    event = [e for e in c.events(job.id) if e.kind == "scale"][-1]
    assert event.message == "target 1 replica(s) of worker (3 worker(s) in all)"
    for role, workers, problem in [
        ("worker", 4, "must be within [1, 3] for role worker"),
        ("ps", 1, "role ps has a fixed size of 2; only a job's elastic role scales"),
        ("chief", 1, "has no role 'chief' (it has ['ps', 'worker'])"),
    ]:
        with pytest.raises(InvalidRequest) as info:
            c.scale(job.id, workers, role=role)
        ((path, message),) = info.value.problems
        assert problem in message and path == ("workers" if role == "worker" else "role")
    assert c.get(job.id).target_slots == 3  # nothing refused was recorded


def test_options_and_405_list_every_method_of_the_path(served: Served) -> None:
    """``OPTIONS /jobs`` listed POST only (the first route Starlette found for the path)."""
    with httpx.Client(base_url=served.url, timeout=30) as client:
        options = client.options("/jobs")
        refused = client.delete("/jobs")
        one = client.options("/jobs/some-job/scale")
    assert options.status_code == 204
    assert options.headers["allow"] == "GET, OPTIONS, POST"
    assert refused.status_code == 405 and refused.headers["allow"] == "GET, OPTIONS, POST"
    assert one.headers["allow"] == "OPTIONS, POST"


def test_validate_without_a_spec_is_a_422(served: Served) -> None:
    headers = {"Authorization": f"Bearer {served.token}", "Content-Type": "application/json"}
    with httpx.Client(base_url=served.url, headers=headers, timeout=30) as client:
        empty = client.post("/jobs/validate")
        not_an_object = client.post("/jobs/validate", content=b"[1, 2]")
        checked = client.post("/jobs/validate", json={"name": "a", "command": []})
    assert empty.status_code == 422 and empty.json()["detail"][0]["loc"] == ["body"]
    assert not_an_object.status_code == 422
    assert checked.status_code == 200 and checked.json()["valid"] is False


def test_every_refusal_a_route_can_answer_is_in_the_schema(served: Served) -> None:
    schema = httpx.get(f"{served.url}/openapi.json", timeout=30).json()
    paths = schema["paths"]
    for path, operations in paths.items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            if path != "/health":
                assert {"401", "403"} <= codes, (method, path)
            if "{ref}" in path:
                assert {"404", "409"} <= codes, (method, path)
            if "requestBody" in operation:
                assert {"400", "413", "422"} <= codes, (method, path)
            for code in codes - {"200", "201", "202", "204", "304"}:
                content = operation["responses"][code]["content"]
                ref = content["application/json"]["schema"]["$ref"]
                assert ref == "#/components/schemas/ErrorBody", (method, path, code)
