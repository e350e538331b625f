"""The worker's side: a model wrapper that pulls parameters and pushes gradients.

``ParameterServerModel(model, optimizer=factory)`` is the whole change to a script: on a
``ps`` process it serves that process's shard (with ``factory`` building the shard's
optimizer) and exits when the job stops it; on a ``worker`` it connects to the servers,
pulls the current parameters before each forward pass and sends the gradients with
:meth:`ParameterServerModel.push` after the backward pass. A background thread exchanges
heartbeats with every server, so a dead server is noticed within the peer timeout; the
worker then waits (up to the recover timeout) for it to come back, restored from its
checkpoint, and goes on. A gradient in flight when that happens is lost, nothing else.

On the job's ``chief`` the same wrapper is an observer: it pulls the current parameters
(its first forward pass pulls; :meth:`ParameterServerModel.pull` refreshes them), never
pushes, and is never counted as a worker; :meth:`~ParameterServerModel.checkpoints`
yields as training goes on and ends once every worker that joined has finished, and
:meth:`~ParameterServerModel.save` writes the whole model's state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import zmq

from tidal.ps.checkpoint import save_atomically
from tidal.ps.chief import WorkerStates, merge_statuses, training_over
from tidal.ps.config import ClusterSpec
from tidal.ps.server import OptimizerFactory
from tidal.ps.serving import serve
from tidal.ps.shard import layout_of, piece_view, trainable
from tidal.ps.termination import close_at_exit, exchange, leave_on_sigterm
from tidal.ps.transport import (
    ParameterServerError,
    ServerLink,
    ServerLost,
    await_replies,
    buffer_tensor,
    decode,
    tensor_buffer,
)

log = logging.getLogger(__name__)


class _Heartbeat(threading.Thread):
    """Beats every server; remembers when each last answered (its own sockets)."""

    def __init__(
        self, worker: str, endpoints: list[str], period: float, observer: bool = False
    ) -> None:
        super().__init__(daemon=True, name="tidal-ps-heartbeat")
        self.worker = worker
        self.observer = observer
        self.endpoints = endpoints  # replaced in place by the worker after a restart
        self.period = period
        self.last_reply = [time.monotonic()] * len(endpoints)
        self.incarnation: list[str | None] = [None] * len(endpoints)  # as the beats say
        self.stopping = threading.Event()

    def run(self) -> None:
        context: zmq.Context[Any] = zmq.Context()
        links = [ServerLink(context, i, e) for i, e in enumerate(self.endpoints)]
        try:
            while not self.stopping.is_set():
                for i, link in enumerate(links):
                    if link.endpoint != self.endpoints[i]:
                        link.reconnect(self.endpoints[i])
                    try:
                        while link.socket.poll(0, zmq.POLLIN):  # any beat's answer will do
                            header, _ = decode(link.socket.recv_multipart(copy=False))
                            self.incarnation[i] = header.get("incarnation")
                            self.last_reply[i] = time.monotonic()
                        beat: dict[str, Any] = {"op": "beat", "worker": self.worker}
                        if self.observer:
                            beat["observer"] = True
                        link.send(beat)
                    except zmq.ZMQError:
                        pass  # a dead server is found by the age of its last answer
                self.stopping.wait(self.period)
        finally:
            for link in links:
                link.close()
            context.term()


class ParameterServerModel(torch.nn.Module):
    """Wrap ``module`` for parameter-server training (see the module docstring).

    ``optimizer`` builds the optimizer of a shard from its parameters, e.g.
    ``lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)``; it runs on the
    servers only. ``spec`` defaults to :meth:`ClusterSpec.from_env`.
    """

    def __init__(
        self, module: torch.nn.Module, optimizer: OptimizerFactory, spec: ClusterSpec | None = None
    ) -> None:
        super().__init__()
        spec = spec or ClusterSpec.from_env()
        if spec.role == "ps":
            raise SystemExit(serve(spec, module, optimizer))
        self.module = module
        self.spec = spec
        self.worker_id = spec.worker_id
        #: whether this process is the job's chief (an observer: pulls, never pushes)
        self.is_chief = spec.role == "chief"
        self.layout = layout_of(module, spec.config.n_ps)
        self._params = trainable(module)
        self._context: zmq.Context[Any] = zmq.Context()
        endpoints = [self._wait_address(i) for i in range(spec.config.n_ps)]
        self._links = [
            ServerLink(self._context, i, e, spec.config.peer_timeout)
            for i, e in enumerate(endpoints)
        ]
        self._heartbeat = _Heartbeat(
            self.worker_id, endpoints, min(0.5, spec.config.peer_timeout / 5), self.is_chief
        )
        self._heartbeat.start()
        self.versions = [0] * spec.config.n_ps  # the version of the parameters we hold
        self.server_versions = [0] * spec.config.n_ps  # the servers' latest we know of
        self.resume_position: dict[str, int] | None = None
        self.data_position: dict[str, int] | None = None  # set by the loader per batch
        self.stats = {
            "pulls": 0,
            "pushes": 0,
            "applied": 0,
            "dropped": 0,
            "recoveries": 0,
            "bytes_pulled": 0,
            "bytes_pushed": 0,
        }
        self._need_pull = True
        self._incarnations: list[str | None] = [None] * spec.config.n_ps
        self._hello(timeout=spec.config.recover_timeout)
        if not self.is_chief:
            leave_on_sigterm()
            close_at_exit(self)  # a script that never closes its model still leaves

    # -- connection -------------------------------------------------------------------
    def _wait_address(self, i: int) -> str:
        deadline = time.monotonic() + self.spec.config.recover_timeout
        while True:
            endpoint = self.spec.server_address(i)
            if endpoint:
                return endpoint
            if time.monotonic() > deadline:
                raise ServerLost(f"parameter server {i} published no address")
            time.sleep(0.05)

    def _alive(self, i: int) -> bool:
        # a server that answers beats but is not the one we said hello to has restarted:
        # what we sent the old one is gone
        beats = self._heartbeat.incarnation[i]
        if beats is not None and beats != self._incarnations[i]:
            return False
        return time.monotonic() - self._heartbeat.last_reply[i] < self.spec.config.peer_timeout

    def _request(self, op: str) -> dict[str, Any]:
        header: dict[str, Any] = {"op": op, "worker": self.worker_id}
        if self.is_chief:
            header["observer"] = True  # the servers never count the chief as a worker
        return header

    def _hello(self, timeout: float) -> None:
        seqs = [
            link.send({**self._request("hello"), "digest": self.layout.digest})
            for link in self._links
        ]
        replies = await_replies(self._links, seqs, lambda i: True, timeout=timeout)
        for i, (header, _) in enumerate(replies):
            self.server_versions[i] = int(header["version"])
            self._incarnations[i] = header.get("incarnation")
        self.resume_position = replies[0][0].get("position")

    def _recover(self, cause: ParameterServerError) -> None:
        """Reconnect to every server (a lost one at its published endpoint) and re-pull."""
        if not isinstance(cause, ServerLost):
            raise cause
        log.warning("worker %s: %s; waiting for the server to return", self.worker_id, cause)
        self.stats["recoveries"] += 1
        deadline = time.monotonic() + self.spec.config.recover_timeout
        while True:
            for i, link in enumerate(self._links):
                endpoint = self.spec.server_address(i) or link.endpoint
                link.reconnect(endpoint)  # always: drop requests queued for the dead one
                self._heartbeat.endpoints[i] = endpoint
            try:
                self._hello(
                    timeout=min(
                        self.spec.config.peer_timeout, max(0.1, deadline - time.monotonic())
                    )
                )
            except (ServerLost, zmq.Again):
                if time.monotonic() > deadline:
                    raise ParameterServerError(
                        f"worker {self.worker_id}: a parameter server did not return within"
                        f" recover_timeout={self.spec.config.recover_timeout}s"
                    ) from cause
                continue
            for i in range(len(self._links)):
                self._heartbeat.last_reply[i] = time.monotonic()
                self._heartbeat.incarnation[i] = self._incarnations[i]
            self._need_pull = True
            return

    # -- the training step --------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Pull if the parameters are too old, then run the wrapped module."""
        if self._should_pull():
            self.pull()
        return self.module(*args, **kwargs)

    def _should_pull(self) -> bool:
        if self.is_chief:  # evaluates one version; pull() refreshes it
            return self._need_pull
        bound = self.spec.config.max_staleness
        if self._need_pull or bound is None or self.spec.config.mode == "sync":
            return True
        return max(s - v for s, v in zip(self.server_versions, self.versions, strict=True)) > bound

    @exchange
    def pull(self) -> None:
        """Copy every shard's current values into the wrapped module."""
        while True:
            try:
                seqs = [link.send(self._request("pull")) for link in self._links]
                replies = await_replies(self._links, seqs, self._alive)
            except (ServerLost, zmq.Again) as exc:
                self._recover(exc if isinstance(exc, ServerLost) else ServerLost(str(exc)))
                continue
            break
        with torch.no_grad():
            for i, (header, buffers) in enumerate(replies):
                pieces = self.layout.shards[i]
                if len(buffers) != len(pieces):
                    raise ParameterServerError(
                        f"parameter server {i}: pull returned a wrong layout"
                    )
                for piece, buf in zip(pieces, buffers, strict=True):
                    piece_view(self._params[piece.param], piece).copy_(
                        buffer_tensor(buf, piece.dtype)
                    )
                    self.stats["bytes_pulled"] += len(buf)
                self.versions[i] = self.server_versions[i] = int(header["version"])
        self.stats["pulls"] += 1
        self._need_pull = False

    @exchange
    def push(self) -> bool:
        """Send the gradients of the last backward pass to the servers and clear them.

        Returns whether every server applied them (``False``: a sync step had already
        closed, the push was too stale, or a server was lost meanwhile). In sync mode the
        call returns when the step is complete. On the chief it raises
        :class:`ParameterServerError`: the chief observes, only workers push."""
        if self.is_chief:
            raise ParameterServerError(
                "push: this process is the job's chief; a chief reads the parameters"
                " (pull, forward, save) and does not push gradients"
            )
        sends = []
        for i, pieces in enumerate(self.layout.shards):
            buffers = []
            for piece in pieces:
                grad = self._params[piece.param].grad
                if grad is None:
                    grad = torch.zeros_like(self._params[piece.param])
                    self._params[piece.param].grad = grad
                buffers.append(tensor_buffer(piece_view(grad, piece)))
            header: dict[str, Any] = {
                "op": "push",
                "worker": self.worker_id,
                "version": self.versions[i],
            }
            if i == 0 and self.data_position is not None:
                header["data"] = self.data_position
            sends.append((header, buffers))
        try:
            seqs = [link.send(h, b) for link, (h, b) in zip(self._links, sends, strict=True)]
            self.stats["bytes_pushed"] += sum(len(x) for _, b in sends for x in b)
            replies = await_replies(self._links, seqs, self._alive)
        except (ServerLost, zmq.Again) as exc:
            self._recover(exc if isinstance(exc, ServerLost) else ServerLost(str(exc)))
            applied = False
        else:
            applied = all(bool(h.get("applied")) for h, _ in replies)
            for i, (header, _) in enumerate(replies):
                self.server_versions[i] = int(header["version"])
        for p in self._params:
            p.grad = None
        self.stats["pushes"] += 1
        self.stats["applied" if applied else "dropped"] += 1
        if self.spec.config.mode == "sync":
            self._need_pull = True
        return applied

    # -- the chief's view ----------------------------------------------------------------
    @property
    def version(self) -> int:
        """The version of the parameters last pulled (the lowest over the shards; they
        are equal unless a restored server went back)."""
        return min(self.versions)

    @exchange
    def worker_states(self) -> WorkerStates:
        """Every worker the servers have heard of: ``active``, ``finished`` (it closed
        its model) or ``lost`` (silent; it may come back under its id), see
        :mod:`tidal.ps.chief`. A lost server is waited for as in :meth:`pull`."""
        while True:
            try:
                seqs = [link.send(self._request("status")) for link in self._links]
                replies = await_replies(self._links, seqs, self._alive)
            except (ServerLost, zmq.Again) as exc:
                self._recover(exc if isinstance(exc, ServerLost) else ServerLost(str(exc)))
                continue
            return merge_statuses(header for header, _ in replies)

    def training_done(self, lost_grace: float | None = None) -> bool:
        """Whether every worker that joined has finished (closed its model), and at
        least one joined. A lost worker is not finished (it may be restarted) unless it
        has been silent for more than ``lost_grace`` seconds."""
        return training_over(self.worker_states(), lost_grace)

    def checkpoints(
        self, every_seconds: float = 5.0, timeout: float = 3600.0, lost_grace: float | None = None
    ) -> Iterator[int]:
        """Pull every ``every_seconds`` and yield the version pulled, until training is
        done (:meth:`training_done`); the last yield holds the final parameters.
        ``TimeoutError`` once ``timeout`` seconds pass without the training ending."""
        deadline = time.monotonic() + timeout
        while True:
            done = self.training_done(lost_grace)  # asked before the pull: it is final
            self.pull()
            yield self.version
            if done:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"checkpoints: the workers did not finish within timeout={timeout}s"
                    f" (workers: {self.worker_states().states})"
                )
            time.sleep(min(every_seconds, left))

    def save(self, path: str | Path) -> Path:
        """Pull, then write the whole module's ``state_dict`` with the version to
        ``path`` atomically (temporary file, fsync, rename): ``{"model": state_dict,
        "version": int, "versions": [per shard]}``. Returns the path."""
        self.pull()
        target = Path(path)
        payload = {
            "model": self.module.state_dict(),
            "version": self.version,
            "versions": list(self.versions),
        }
        save_atomically(target, payload)
        return target

    @exchange
    def close(self) -> None:
        """Leave the job cleanly (servers stop counting this worker at once)."""
        if self._context.closed:
            return
        try:
            if not self.is_chief:  # the chief was never a member
                seqs = [link.send(self._request("leave")) for link in self._links]
                await_replies(self._links, seqs, self._alive, timeout=self.spec.config.peer_timeout)
        except (ParameterServerError, zmq.ZMQError) as exc:
            log.info("leave: %s", exc)
        self._heartbeat.stopping.set()
        self._heartbeat.join(timeout=5)
        for link in self._links:
            link.close()
        self._context.term()

    def __enter__(self) -> ParameterServerModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
