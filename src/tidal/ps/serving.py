"""A parameter server's process: the socket loop around its :class:`ShardServer`.

The loop reads requests from a ROUTER socket, 64 at most per poll, hands each to the
server's step rule and sends the replies, each tensor frame tracked so the optimizer
never changes parameters ZeroMQ is still sending. A restarted server binds its previous
endpoint again where it can, so workers reconnect by themselves. A server whose optimizer
failed answers with its traceback for :data:`FAILED_LINGER` seconds, then exits 1.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from typing import Any

import torch
import zmq

from tidal.ps.config import ClusterSpec, publish_address
from tidal.ps.server import OptimizerFactory, ShardServer
from tidal.ps.transport import Header, decode, encode

__all__ = ["FAILED_LINGER", "run_server", "serve"]

log = logging.getLogger(__name__)

FAILED_LINGER = 60.0  # seconds a failed server keeps answering with its traceback


def run_server(server: ShardServer, stop: threading.Event | None = None) -> int:
    """Serve ``server`` until ``stop`` is set or SIGTERM; returns the process exit code."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    context: zmq.Context[Any] = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
    endpoint = _bind(server, sock)
    if server.spec.address_dir:
        publish_address(server.spec.address_dir, server.shard, endpoint)
    print(
        f"parameter server {server.shard} serving {endpoint} version {server.version}"
        f" ({server.layout.nbytes(server.shard)} bytes)",
        flush=True,
    )
    started = time.monotonic()
    cpu0 = time.process_time()
    try:
        while not stop.is_set():
            now = time.monotonic()
            if server.failure is not None and now - started > FAILED_LINGER:
                break
            replies: list[tuple[bytes, Header, list[memoryview]]] = []
            if sock.poll(100, zmq.POLLIN):
                for _ in range(64):
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    identity = bytes(frames[0].buffer)
                    try:
                        header, buffers = decode(frames[1:])
                        replies += server.handle(identity, header, buffers, now)
                    except Exception as exc:  # a bad request must not stop the server
                        replies.append((identity, {"ok": False, "error": repr(exc)}, []))
                    _send(server, sock, replies)
                    replies = []
            replies += [(i, h, []) for i, h in server.expire(time.monotonic())]
            _send(server, sock, replies)
    finally:
        if server.failure is None:
            server.save()
        stats = {
            **server.stats,
            "shard": server.shard,
            "version": server.version,
            "cpu_s": round(time.process_time() - cpu0, 3),
            "wall_s": round(time.monotonic() - started, 3),
        }
        print("ps-stats " + json.dumps(stats), flush=True)
        sock.close(linger=0)
        context.term()
    return 1 if server.failure is not None else 0


def _bind(server: ShardServer, sock: zmq.Socket[Any]) -> str:
    # A restarted server takes its previous endpoint back when it can, so workers'
    # sockets reconnect by themselves; otherwise it publishes a new one.
    previous = server.spec.server_address(server.shard) if server.spec.address_dir else None
    if previous and server.spec.bind.endswith(":0"):
        with contextlib.suppress(zmq.ZMQError):
            sock.bind(previous)
            return previous
    sock.bind(server.spec.bind)
    return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))


def _send(
    server: ShardServer,
    sock: zmq.Socket[Any],
    replies: list[tuple[bytes, Header, list[memoryview]]],
) -> None:
    for identity, header, buffers in replies:
        # one tracker per tensor frame: the optimizer waits until ZeroMQ has let go
        frames = [zmq.Frame(b, track=True) for b in buffers]
        try:
            sock.send_multipart([identity, *encode(header), *frames], copy=False)
        except zmq.ZMQError as exc:  # the worker has gone: nothing to answer
            log.info("reply to a gone worker dropped: %s", exc)
            continue
        server.trackers += [f.tracker for f in frames if f.tracker is not None]


def serve(spec: ClusterSpec, model: torch.nn.Module, optimizer: OptimizerFactory) -> int:
    """Run server ``spec.index`` of the job until it is stopped; returns the exit code."""
    logging.basicConfig(level=os.environ.get("TIDAL_LOG_LEVEL", "WARNING"))
    torch.set_num_threads(max(1, torch.get_num_threads()))
    return run_server(ShardServer(spec, model, optimizer))
