"""The servers' step rules and checkpoints, driven in-process (no sockets)."""

from __future__ import annotations

import torch
from torch import nn

from tidal.ps import checkpoint
from tidal.ps.config import ClusterSpec, PSConfig
from tidal.ps.server import ShardServer
from tidal.ps.transport import Header, buffer_tensor, tensor_buffer


def _server(config: PSConfig, shard: int = 0) -> ShardServer:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    spec = ClusterSpec(role="ps", index=shard, config=config)
    return ShardServer(spec, model, lambda p: torch.optim.SGD(p, lr=1.0))


def _grad(server: ShardServer, value: float) -> list[memoryview]:
    return [tensor_buffer(torch.full((p.numel,), value)) for p in server.pieces]


def _push(
    server: ShardServer, worker: str, value: float, version: int | None = None, now: float = 0.0
) -> list[tuple[bytes, Header, list[memoryview]]]:
    header = {
        "op": "push",
        "worker": worker,
        "seq": 1,
        "version": server.version if version is None else version,
    }
    return server.handle(worker.encode(), header, _grad(server, value), now)


def test_tensor_frames_are_views_not_copies() -> None:
    t = torch.arange(6, dtype=torch.float32)
    view = buffer_tensor(tensor_buffer(t[2:5]), torch.float32)
    t[3] = 42.0
    assert view.tolist() == [2.0, 42.0, 4.0]


def test_sync_averages_and_drops_the_backup_workers_late_gradient() -> None:
    server = _server(PSConfig(mode="sync", replicas_to_aggregate=2, max_workers=3))
    before = torch.cat([v.detach().clone() for v in server.values])
    for w in ("a", "b", "c"):
        server.handle(
            w.encode(),
            {"op": "hello", "worker": w, "seq": 0, "digest": server.layout.digest},
            [],
            0.0,
        )
    assert _push(server, "a", 1.0) == []  # held until the step is complete
    replies = _push(server, "b", 3.0)
    assert sorted(h["aggregated"] for _, h, _ in replies) == [2, 2]
    assert {i for i, _, _ in replies} == {b"a", b"b"}
    after = torch.cat([v.detach() for v in server.values])
    assert torch.allclose(after, before - 2.0)  # lr 1 x mean(1, 3)
    late = _push(server, "c", 100.0, version=0)
    assert late[0][1]["applied"] is False and server.version == 1
    assert torch.equal(torch.cat([v.detach() for v in server.values]), after)


def test_sync_count_follows_the_workers_and_a_silent_one_is_dropped() -> None:
    server = _server(PSConfig(mode="sync", max_workers=4, peer_timeout=2.0))
    for w in ("a", "b", "c"):
        server.handle(w.encode(), {"op": "beat", "worker": w, "seq": 0}, [], 0.0)
    assert server.required() == 3
    _push(server, "a", 1.0, now=1.0)
    _push(server, "b", 1.0, now=1.5)
    # a worker that joins while the step is open counts from the next step
    server.handle(b"d", {"op": "beat", "worker": "d", "seq": 0}, [], 1.6)
    assert server.required() == 3 and server.version == 0
    replies = server.expire(2.5)  # c silent for 2.5 s > 2 s: the step completes without it
    assert server.version == 1 and len(replies) == 2
    assert server.members == {"a", "b", "d"}


def _chief(server: ShardServer, op: str, now: float = 0.0):  # type: ignore[no-untyped-def]
    header = {"op": op, "worker": "chief", "seq": 9, "observer": True}
    if op == "hello":
        header["digest"] = server.layout.digest
    return server.handle(b"chief", header, [], now)


def test_sync_steps_aggregate_the_workers_gradients_never_the_chiefs() -> None:
    server = _server(PSConfig(mode="sync", max_workers=2))
    before = torch.cat([v.detach().clone() for v in server.values])
    _chief(server, "hello")
    for w in ("a", "b"):
        server.handle(
            w.encode(),
            {"op": "hello", "worker": w, "seq": 0, "digest": server.layout.digest},
            [],
            0,
        )
    _chief(server, "beat")
    ((_, pulled, frames),) = _chief(server, "pull")
    assert pulled["ok"] and len(frames) == len(server.pieces)
    assert server.members == {"a", "b"} and server.required() == 2
    for step in range(3):
        assert _push(server, "a", 1.0) == []  # waits for b, not for the chief
        replies = _push(server, "b", 3.0)
        assert sorted(h["aggregated"] for _, h, _ in replies) == [2, 2]
        assert server.version == step + 1
        _chief(server, "beat")
    after = torch.cat([v.detach() for v in server.values])
    assert torch.allclose(after, before - 3 * 2.0)  # lr 1 x mean(1, 3), three steps
    ((_, refused, _),) = _chief(server, "push")
    assert refused["ok"] is False and "does not push" in refused["error"]
    assert server.version == 3


def test_status_tells_finished_workers_from_lost_ones() -> None:
    server = _server(PSConfig(mode="async", peer_timeout=2.0))
    for w in ("a", "b"):
        server.handle(w.encode(), {"op": "beat", "worker": w, "seq": 0}, [], 0.0)
    ((_, status, _),) = _chief(server, "status")
    assert status["workers"] == {"a": "active", "b": "active"}
    server.handle(b"a", {"op": "leave", "worker": "a", "seq": 1}, [], 0.5)
    server.handle(b"a", {"op": "beat", "worker": "a", "seq": 2}, [], 0.6)  # a late beat
    server.expire(3.0)  # b silent for 3 s
    assert server.status(4.0) == {
        "version": 0,
        "workers": {"a": "finished", "b": "lost"},
        "lost_for": {"b": 1.0},
    }
    assert server.members == set()
    # b restarted under its id: active again; a rejoining worker says hello first
    server.handle(b"b", {"op": "hello", "worker": "b", "seq": 0, "digest": ""}, [], 3.5)
    server.handle(b"a", {"op": "hello", "worker": "a", "seq": 0, "digest": ""}, [], 3.5)
    assert server.status(4.0)["workers"] == {"a": "active", "b": "active"}


def test_async_applies_each_push_and_refuses_too_stale_ones() -> None:
    server = _server(PSConfig(mode="async", max_staleness=1))
    assert _push(server, "a", 1.0)[0][1]["applied"] is True
    assert _push(server, "b", 1.0, version=0)[0][1]["applied"] is True  # 1 behind: fine
    assert server.version == 2
    refused = _push(server, "b", 1.0, version=0)  # 2 behind
    assert refused[0][1]["applied"] is False and server.version == 2


def test_failed_optimizer_factory_answers_with_its_traceback() -> None:
    spec = ClusterSpec(role="ps", index=0, config=PSConfig())
    server = ShardServer(spec, nn.Linear(2, 2), lambda p: torch.optim.SGD(p, lr=-1.0))
    ((_, header, _),) = server.handle(
        b"a", {"op": "hello", "worker": "a", "seq": 3, "digest": "x"}, [], 0.0
    )
    assert header["ok"] is False
    assert "optimizer factory failed on parameter server 0" in header["error"]
    assert "Traceback" in header["error"] and "Invalid learning rate" in header["error"]


def test_checkpoints_are_consistent_across_shards_and_restored(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = PSConfig(n_ps=2, mode="async", checkpoint_dir=str(tmp_path), checkpoint_every=2)
    s0, s1 = _server(config, 0), _server(config, 1)
    for _ in range(3):
        _push(s0, "a", 1.0)
    for _ in range(5):
        _push(s1, "a", 1.0)
    assert checkpoint.versions_of(str(tmp_path), 1, 2) == {2, 4}
    assert checkpoint.latest_consistent(str(tmp_path), 2) == 2  # shard 0 has only version 2
    s0.positions["a"] = {"epoch": 1, "batch": 5}
    s0.save()  # version 3
    restored = _server(config, 1)
    assert restored.version == 2 and restored.restored_from == 2
    assert not list(tmp_path.glob("*.tmp*"))  # written by rename, nothing half-written left
    assert _server(config, 0).positions == {}  # restored from version 2, before the position
