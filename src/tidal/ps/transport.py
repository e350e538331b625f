"""Messages between workers and servers over ZeroMQ: a JSON header and raw tensor buffers.

A message is one ZeroMQ multipart message: frame 0 is a small JSON header, every further
frame the bytes of one tensor piece (no pickling). Sending hands ZeroMQ a ``memoryview`` of
the tensor's own memory (``copy=False``); receiving wraps the frame's memory as a tensor
(``torch.frombuffer``), so a gradient or parameter crosses with no copy in Python. A
multipart message arrives whole or not at all: a worker killed mid-push loses that gradient
and nothing else.

Workers talk to a server through a DEALER socket and the server answers through a ROUTER,
which lets a sync server hold a worker's reply until the step is complete. Every wait is
bounded; a peer silent for longer than the peer timeout is :class:`ServerLost`.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import zmq

Header = dict[str, Any]


class ParameterServerError(RuntimeError):
    """A server refused a request or failed; the message carries its traceback."""


class ServerLost(ParameterServerError):
    """A server did not answer within the peer timeout (dead, or unreachable)."""


def tensor_buffer(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy."""
    flat = tensor.detach().reshape(-1)
    if not flat.is_contiguous() or flat.device.type != "cpu":
        raise ValueError("tensor_buffer: expected a contiguous CPU tensor")
    array: Any = flat.view(torch.uint8).numpy()
    return memoryview(array)


def buffer_tensor(buffer: memoryview | bytes, dtype: torch.dtype) -> torch.Tensor:
    """A 1-D tensor of ``dtype`` over ``buffer``'s memory (no copy)."""
    with warnings.catch_warnings():  # bytes frames are read-only; we never write into them
        warnings.simplefilter("ignore", UserWarning)
        raw = (
            torch.frombuffer(buffer, dtype=torch.uint8)
            if len(buffer)
            else torch.empty(0, dtype=torch.uint8)
        )
    return raw.view(dtype)


def encode(header: Header, buffers: Sequence[memoryview] = ()) -> list[Any]:
    """The frames of a message."""
    return [json.dumps(header).encode(), *buffers]


def decode(frames: Sequence[zmq.Frame]) -> tuple[Header, list[memoryview]]:
    """A message's header and its buffers (views into the received frames)."""
    header = json.loads(bytes(frames[0].buffer))
    if not isinstance(header, dict):
        raise ParameterServerError("malformed message header")
    return header, [f.buffer for f in frames[1:]]


class ServerLink:
    """One worker's request channel to one server (a DEALER socket), reconnectable."""

    def __init__(
        self, context: zmq.Context[Any], index: int, endpoint: str, send_timeout: float = 5.0
    ) -> None:
        self.context = context
        self.send_timeout_ms = int(send_timeout * 1000)
        self.index = index
        self.endpoint = endpoint
        self.socket: zmq.Socket[Any] = self._connect(endpoint)
        self.seq = 0

    def _connect(self, endpoint: str) -> zmq.Socket[Any]:
        sock: zmq.Socket[Any] = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 500)
        # a send never blocks for long, even with a dead server's queue full
        sock.setsockopt(zmq.SNDTIMEO, self.send_timeout_ms)
        sock.connect(endpoint)
        return sock

    def reconnect(self, endpoint: str) -> None:
        """Drop anything queued and connect afresh (to a restarted server's endpoint)."""
        self.socket.close(linger=0)
        self.endpoint = endpoint
        self.socket = self._connect(endpoint)

    def send(self, header: Header, buffers: Sequence[memoryview] = ()) -> int:
        """Send a request; returns its sequence number (the reply echoes it)."""
        self.seq += 1
        header = {**header, "seq": self.seq}
        self.socket.send_multipart(encode(header, buffers), copy=False)
        return self.seq

    def poll_reply(self, seq: int) -> tuple[Header, list[memoryview]] | None:
        """The reply to request ``seq`` if it is here now (older replies are dropped)."""
        while self.socket.poll(0, zmq.POLLIN):
            header, buffers = decode(self.socket.recv_multipart(copy=False))
            if header.get("seq") != seq:
                continue  # the late answer to a request we gave up on
            if not header.get("ok", False):
                raise ParameterServerError(
                    f"parameter server {self.index} ({self.endpoint}): {header.get('error')}"
                )
            return header, buffers
        return None

    def close(self) -> None:
        self.socket.close(linger=0)


def await_replies(
    links: Sequence[ServerLink],
    seqs: Sequence[int],
    alive: Callable[[int], bool],
    timeout: float | None = None,
) -> list[tuple[Header, list[memoryview]]]:
    """Wait for the reply to ``seqs[i]`` on each ``links[i]``.

    The wait ends with :class:`ServerLost` as soon as ``alive(i)`` says a server has gone
    silent (its heartbeats stopped), or after ``timeout`` seconds if given; it never hangs.
    """
    replies: list[tuple[Header, list[memoryview]] | None] = [None] * len(links)
    poller = zmq.Poller()
    for link in links:
        poller.register(link.socket, zmq.POLLIN)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        for i, link in enumerate(links):
            if replies[i] is None:
                replies[i] = link.poll_reply(seqs[i])
        missing = [i for i, r in enumerate(replies) if r is None]
        if not missing:
            return [r for r in replies if r is not None]
        for i in missing:
            if not alive(links[i].index):
                raise ServerLost(
                    f"parameter server {links[i].index} ({links[i].endpoint}) stopped answering"
                )
        if deadline is not None and time.monotonic() > deadline:
            raise ServerLost(
                f"parameter server {links[missing[0]].index}: no reply in {timeout:.0f}s"
            )
        poller.poll(100)
