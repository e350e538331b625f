"""Hostile requests against a real server on loopback: 4xx naming the field, never a 500."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI

from tests.controller.conftest import Served
from tests.controller.hostile import CASES, JSON, Hostile
from tidal.controller.routes.limits import MAX_BODY_BYTES, install_request_guards
from tidal.server.process import ApiServer


def snapshot(served: Served) -> tuple[object, ...]:
    return (served.store.list_jobs(), served.store.events(), served.store.allocations())


def http(served: Served) -> httpx.Client:
    return httpx.Client(
        base_url=served.url, headers={"Authorization": f"Bearer {served.token}"}, timeout=30
    )


def paths(response: httpx.Response) -> list[tuple[str, str]]:
    body = response.json()
    found = body["detail"] if "detail" in body else body["problems"]
    return [(d["path"], d["msg"]) for d in found]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_hostile_spec_is_refused_naming_the_field(served: Served, case: Hostile) -> None:
    c = served.client()
    kept = c.submit({"name": "kept", "command": ["python", "t.py"]})
    before = snapshot(served)
    with http(served) as client:
        headers = {"Content-Type": case.content_type}
        submitted = client.post("/jobs", content=case.body, headers=headers)
        checked = client.post("/jobs/validate", content=case.body, headers=headers)
        listed = client.get("/jobs")
    if case.path is None:
        assert (submitted.status_code, checked.status_code) == (413, 413)
        assert str(MAX_BODY_BYTES) in submitted.json()["detail"]
    else:
        assert submitted.status_code == 422, submitted.text
        assert case.named_by(paths(submitted)), paths(submitted)
        if case.path == "" and case.content_type == JSON:
            # No JSON object at all (or no body): not a spec to check but a bad request.
            assert checked.status_code == 422, checked.text
        else:
            assert checked.status_code == 200 and checked.json()["valid"] is False
        assert case.named_by(paths(checked)), paths(checked)
    assert listed.status_code == 200
    assert [j["id"] for j in listed.json()] == [kept.id]
    assert snapshot(served) == before


@pytest.mark.parametrize(
    ("method", "route", "body", "field"),
    [
        ("GET", "/jobs?limit=9223372036854775808", None, "limit"),
        ("GET", "/jobs?limit=99999999999999999999999", None, "limit"),
        ("POST", "/jobs/{id}/metrics", {"step": 2**63, "values": {"loss": 1.0}}, "step"),
        ("POST", "/jobs/{id}/metrics", {"step": 1, "values": {"\ud800": 1.0}}, "values"),
        ("POST", "/jobs/{id}/scale", {"workers": 2**63}, "workers"),
        ("POST", "/jobs/{id}/scale-out", {"count": 2**63}, "count"),
        ("POST", "/jobs/{id}/scale-out", {"count": 1, "timeout_s": 1e400}, "timeout_s"),
        ("POST", "/jobs/{id}/scale-in", {"count": 2**64}, "count"),
        ("PUT", "/jobs/{id}/priority", {"priority": 2**63}, "priority"),
        ("GET", "/jobs/{id}/events?limit=9223372036854775808", None, "limit"),
        ("GET", "/jobs/{id}/logs?tail=9223372036854775808", None, "tail"),
    ],
)
def test_out_of_range_integers_are_422_naming_the_field(
    served: Served, method: str, route: str, body: object, field: str
) -> None:
    job = served.client().submit({"name": "a", "command": ["x"], "workers": "1:4"})
    before = snapshot(served)
    with http(served) as client:
        # Encoded here: httpx's json= would refuse the lone surrogate on this side.
        content = json.dumps(body).encode() if body is not None else None
        response = client.request(
            method,
            route.format(id=job.id),
            content=content,
            headers={"Content-Type": "application/json"},
        )
        assert client.get("/jobs").status_code == 200
    assert response.status_code == 422, response.text
    assert field in {str(part) for d in response.json()["detail"] for part in d["loc"]}
    assert snapshot(served) == before


def test_body_over_the_limit_is_413_before_it_is_read(served: Served) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: sent chunked
        for _ in range(40):
            yield b"x" * 4096

    with http(served) as client:
        declared = client.post("/jobs", content=b"{" + b" " * MAX_BODY_BYTES + b"}")
        chunked = client.post("/jobs", content=chunks(), headers={"Content-Type": "text/yaml"})
        small = client.put("/jobs/nope/priority", content=b"x" * (MAX_BODY_BYTES + 1))
        assert client.get("/health").status_code == 200
    for response in (declared, chunked, small):
        assert response.status_code == 413
        assert response.json()["detail"] == (
            f"request body is larger than the {MAX_BODY_BYTES} bytes allowed"
        )
    assert served.store.list_jobs() == []


def _read_response(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before a response"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside a response"
        body += chunk
    return int(head.split()[1]), body


def test_unhandled_error_is_a_logged_json_500_and_keeps_the_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = FastAPI()

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    @app.get("/fine")
    async def fine() -> dict[str, str]:
        return {"status": "ok"}

    install_request_guards(app)
    server = ApiServer(app)
    server.start()
    host, port = server.url.removeprefix("http://").split(":")
    try:
        with caplog.at_level(logging.ERROR), socket.create_connection((host, int(port))) as s:
            s.settimeout(10)
            s.sendall(b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
            status, body = _read_response(s)
            # The same connection still answers: the error did not close it.
            s.sendall(b"GET /fine HTTP/1.1\r\nHost: x\r\n\r\n")
            again, _ = _read_response(s)
    finally:
        server.stop()
    assert (status, again) == (500, 200)
    error = json.loads(body)
    assert error["error_id"] in error["detail"]
    logged = [r for r in caplog.records if error["error_id"] in r.getMessage()]
    assert logged and logged[0].exc_info is not None
    assert "a bug" in str(logged[0].exc_info[1])
