"""A parameter server: one shard of the parameters, its optimizer, and the step rule.

The server is a single-threaded loop over a ROUTER socket. ``sync``: it collects the
gradients pushed for its current version; when ``replicas_to_aggregate`` of them are in
(by default every worker that was a member when the step opened) it applies their average,
bumps the version and answers the waiting workers; a gradient for an older version (a
backup worker's, too late) is dropped. ``async``: each push is applied on arrival; with
``max_staleness`` a push computed on parameters more than that many versions old is
refused and its worker pulls. Workers hold leases renewed by their heartbeats; a worker
silent for ``peer_timeout`` has left (in sync, the step stops waiting for it).

A request marked ``observer`` comes from the job's chief: it may pull and ask for the
workers' states (``status``), never push, and is no member (no sync step waits for it).
A worker's state is ``active`` (heard from within the peer timeout), ``finished`` (it
said ``leave``: its script closed the model) or ``lost`` (silent; it may be restarted
under the same id, which makes it active again).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

import torch
import zmq

from tidal.ps import checkpoint
from tidal.ps.config import ClusterSpec
from tidal.ps.shard import layout_of, piece_view, trainable
from tidal.ps.transport import Header, buffer_tensor, tensor_buffer

log = logging.getLogger(__name__)

OptimizerFactory = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]


class ShardServer:
    """The state and step rule of one server (its socket loop is
    :func:`tidal.ps.serving.run_server`)."""

    def __init__(
        self, spec: ClusterSpec, model: torch.nn.Module, optimizer: OptimizerFactory
    ) -> None:
        self.spec = spec
        self.config = spec.config
        self.shard = spec.index
        self.layout = layout_of(model, self.config.n_ps)
        self.pieces = self.layout.shards[self.shard]
        params = trainable(model)
        self.values = [
            torch.nn.Parameter(piece_view(params[p.param], p).clone()) for p in self.pieces
        ]
        self.version = 0
        # tells workers a restarted server from the one they sent a request to
        self.incarnation = f"{os.getpid()}-{time.time_ns()}"
        self.positions: dict[str, Any] = {}  # worker id -> its data position (shard 0)
        self.failure: str | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        try:
            self.optimizer = optimizer(list(self.values))
            if not isinstance(self.optimizer, torch.optim.Optimizer):
                raise TypeError(
                    f"optimizer: the factory returned {type(self.optimizer).__name__},"
                    " not a torch.optim.Optimizer"
                )
        except Exception:
            self.failure = (
                f"optimizer factory failed on parameter server {self.shard}:\n"
                + traceback.format_exc()
            )
            print(self.failure, file=sys.stderr, flush=True)
        self.restored_from: int | None = None
        if self.failure is None and self.config.checkpoint_dir:
            self._restore()
        # membership and the open sync step
        self.last_seen: dict[str, float] = {}
        self.finished: set[str] = set()  # workers that left cleanly (said leave)
        self.lost: dict[str, float] = {}  # workers that went silent -> when they did
        self.members: set[str] = set()
        self.pending: set[str] = set()
        self.pushed: dict[str, tuple[bytes, int]] = {}  # worker -> (identity, seq)
        self.accum: list[torch.Tensor] | None = None
        self.trackers: list[zmq.MessageTracker] = []
        self.stats = {
            "pushes": 0,
            "applied": 0,
            "dropped": 0,
            "pulls": 0,
            "bytes_in": 0,
            "bytes_out": 0,
        }

    # -- checkpoints ------------------------------------------------------------------
    def _restore(self) -> None:
        directory = self.config.checkpoint_dir
        assert directory is not None and self.optimizer is not None
        version = checkpoint.latest_consistent(directory, self.config.n_ps)
        if version is None:
            return
        payload = checkpoint.read_shard(directory, self.shard, self.config.n_ps, version)
        if payload.get("digest") != self.layout.digest:
            raise ValueError(
                f"checkpoint_dir: shard {self.shard} at version {version} was written for"
                " another model or n_ps"
            )
        with torch.no_grad():
            for value, saved in zip(self.values, payload["values"], strict=True):
                value.copy_(saved)
        self.optimizer.load_state_dict(payload["optimizer"])
        self.version = int(payload["version"])
        self.positions = dict(payload.get("positions", {}))
        self.restored_from = self.version
        log.warning(
            "parameter server %d restored its shard at version %d", self.shard, self.version
        )

    def save(self) -> None:
        """Checkpoint this shard at its current version (if the job has a directory)."""
        if not self.config.checkpoint_dir or self.optimizer is None:
            return
        payload = {
            "version": self.version,
            "digest": self.layout.digest,
            "values": [v.detach() for v in self.values],
            "optimizer": self.optimizer.state_dict(),
            "positions": self.positions,
        }
        checkpoint.write_shard(
            self.config.checkpoint_dir, self.shard, self.config.n_ps, self.version, payload
        )

    # -- membership -------------------------------------------------------------------
    def _seen(self, worker: str, now: float) -> None:
        if worker not in self.last_seen:
            # sync: a worker that joins while a step is open counts from the next one
            (self.pending if self.pushed else self.members).add(worker)
            self.lost.pop(worker, None)
            log.info("worker %s joined parameter server %d", worker, self.shard)
        self.last_seen[worker] = now

    def _leave(self, worker: str) -> None:
        self.last_seen.pop(worker, None)
        self.members.discard(worker)
        self.pending.discard(worker)

    def expire(self, now: float) -> list[tuple[bytes, Header]]:
        """Drop workers silent for longer than the peer timeout; replies that frees."""
        for worker, seen in list(self.last_seen.items()):
            if now - seen > self.config.peer_timeout:
                log.warning("worker %s left parameter server %d (silent)", worker, self.shard)
                self._leave(worker)
                self.lost[worker] = now
        return self._maybe_finish_step()

    def required(self) -> int:
        """Gradients the open sync step needs."""
        # A fixed count is kept even when fewer workers are left (the step waits for
        # replacements, as TensorFlow's SyncReplicasOptimizer does); otherwise the
        # count follows the workers that were members when the step opened.
        return self.config.replicas_to_aggregate or len(self.members) or 1

    # -- requests ---------------------------------------------------------------------
    def handle(
        self, identity: bytes, header: Header, buffers: list[memoryview], now: float
    ) -> list[tuple[bytes, Header, list[memoryview]]]:
        """Answer one request: the replies to send now (possibly to other workers)."""
        op, seq, worker = header.get("op"), header.get("seq"), str(header.get("worker", ""))
        self.stats["bytes_in"] += sum(len(b) for b in buffers)
        observer = bool(header.get("observer"))
        if op == "hello" and not observer:
            self.finished.discard(worker)  # a worker rejoining under its id
        # a beat sent after the worker's leave (its heartbeat thread stops last) must not
        # make it a member again
        if worker and not observer and not (op == "beat" and worker in self.finished):
            self._seen(worker, now)
        if op == "beat":
            reply = {
                "ok": True,
                "seq": seq,
                "version": self.version,
                "incarnation": self.incarnation,
            }
            return [(identity, reply, [])]
        if self.failure is not None:
            return [(identity, {"ok": False, "seq": seq, "error": self.failure}, [])]
        if op == "hello":
            if header.get("digest") != self.layout.digest:
                error = (
                    f"the worker's model does not match parameter server {self.shard}'s"
                    " (different parameters or n_ps)"
                )
                return [(identity, {"ok": False, "seq": seq, "error": error}, [])]
            reply = {
                "ok": True,
                "seq": seq,
                "version": self.version,
                "position": self.positions.get(worker),
                "incarnation": self.incarnation,
                "mode": self.config.mode,
            }
            return [(identity, reply, [])]
        if op == "pull":
            self.stats["pulls"] += 1
            out = [tensor_buffer(v) for v in self.values]
            self.stats["bytes_out"] += sum(len(b) for b in out)
            return [(identity, {"ok": True, "seq": seq, "version": self.version}, out)]
        if op == "status":
            return [(identity, {"ok": True, "seq": seq, **self.status(now)}, [])]
        if observer and op in ("push", "leave"):
            error = f"{op}: the chief ({worker}) observes the job; it does not {op}"
            return [(identity, {"ok": False, "seq": seq, "error": error}, [])]
        if op == "leave":
            self._leave(worker)
            self.finished.add(worker)
            return [
                (identity, {"ok": True, "seq": seq}, []),
                *self._wrap(self._maybe_finish_step()),
            ]
        if op == "push":
            return self._push(identity, header, buffers)
        return [(identity, {"ok": False, "seq": seq, "error": f"unknown op {op!r}"}, [])]

    def status(self, now: float) -> dict[str, Any]:
        """This server's version, every worker it has heard of by state, and for how
        many seconds each lost one has been silent."""
        workers = {w: "lost" for w in self.lost}
        workers.update({w: "finished" for w in self.finished})
        workers.update({w: "active" for w in self.last_seen})
        lost_for = {w: round(now - t, 3) for w, t in self.lost.items() if workers[w] == "lost"}
        return {"version": self.version, "workers": workers, "lost_for": lost_for}

    @staticmethod
    def _wrap(
        replies: Iterable[tuple[bytes, Header]],
    ) -> list[tuple[bytes, Header, list[memoryview]]]:
        return [(i, h, []) for i, h in replies]

    def _push(
        self, identity: bytes, header: Header, buffers: list[memoryview]
    ) -> list[tuple[bytes, Header, list[memoryview]]]:
        seq, worker, base = header.get("seq"), str(header.get("worker", "")), int(header["version"])
        if len(buffers) != len(self.pieces) or any(
            len(b) != p.nbytes for b, p in zip(buffers, self.pieces, strict=False)
        ):
            error = f"push: the gradient does not match shard {self.shard}'s layout"
            return [(identity, {"ok": False, "seq": seq, "error": error}, [])]
        self.stats["pushes"] += 1
        if "data" in header:  # the worker's data position after this gradient's batch
            self.positions[worker] = header["data"]
        grads = [buffer_tensor(b, p.dtype) for b, p in zip(buffers, self.pieces, strict=True)]
        if self.config.mode == "async":
            if (
                self.config.max_staleness is not None
                and self.version - base > self.config.max_staleness
            ):
                self.stats["dropped"] += 1
                reply = {"ok": True, "seq": seq, "applied": False, "version": self.version}
                return [(identity, reply, [])]
            self._apply(grads)
            return [
                (identity, {"ok": True, "seq": seq, "applied": True, "version": self.version}, [])
            ]
        if base == self.version and worker in self.pushed:
            # a resend after the worker reconnected: keep its first gradient, and answer
            # the new request (the old socket is gone) when the step completes
            self.stats["dropped"] += 1
            self.pushed[worker] = (identity, int(seq or 0))
            return []
        if base != self.version:
            # too late for its step (a backup worker), or from before a restore
            self.stats["dropped"] += 1
            return [
                (identity, {"ok": True, "seq": seq, "applied": False, "version": self.version}, [])
            ]
        if self.accum is None:
            self.accum = [g.clone() for g in grads]
        else:
            for acc, g in zip(self.accum, grads, strict=True):
                acc.add_(g)
        self.pushed[worker] = (identity, int(seq or 0))
        return self._wrap(self._maybe_finish_step())

    def _maybe_finish_step(self) -> list[tuple[bytes, Header]]:
        if self.config.mode != "sync" or not self.pushed or len(self.pushed) < self.required():
            return []
        assert self.accum is not None
        count = len(self.pushed)
        for acc in self.accum:
            acc.div_(count)
        self._apply(self.accum)
        replies = [
            (
                identity,
                {
                    "ok": True,
                    "seq": seq,
                    "applied": True,
                    "version": self.version,
                    "aggregated": count,
                },
            )
            for identity, seq in self.pushed.values()
        ]
        self.pushed, self.accum = {}, None
        self.members |= self.pending
        self.pending = set()
        return replies

    def _apply(self, grads: list[torch.Tensor]) -> None:
        assert self.optimizer is not None
        for tracker in self.trackers:  # parameters still being sent must not change
            if not tracker.done:
                with contextlib.suppress(zmq.NotDone):
                    tracker.wait(1.0)
        self.trackers = []
        for value, grad in zip(self.values, grads, strict=True):
            value.grad = grad
        self.optimizer.step()
        for value in self.values:
            value.grad = None
        self.version += 1
        self.stats["applied"] += 1
        every = self.config.checkpoint_every
        if every and self.version % every == 0:
            self.save()
