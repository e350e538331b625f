"""Running the controller: the loop in a thread and the API under uvicorn."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from tidal.backends.base import ClusterScaling, HostDiscovery
from tidal.controller.cluster import ClusterModel, detect_local, local_address
from tidal.controller.credentials import ServerKey
from tidal.controller.loop.cluster_scaling import ClusterRequests
from tidal.controller.loop.controller import Controller
from tidal.controller.loop.launching import JobFiles
from tidal.controller.plugins import PluginError, load_backend, load_policy
from tidal.controller.resource_groups import ClusterConfig, apply_groups
from tidal.controller.routes.auth import ensure_token
from tidal.controller.store.jobs import JobStore
from tidal.controller.store.server_lock import StoreLock, hold_store
from tidal.launch.file_modes import private_files
from tidal.launch.log_sink import DEFAULT_LOG_BACKUPS, DEFAULT_LOG_MAX_BYTES
from tidal.launch.warm_plan import available_memory, plan_standby
from tidal.policy.api import Policy
from tidal.policy.team_queues import TeamQueues, pool_capacity
from tidal.policy.teams import Team, check_quotas
from tidal.policy.whole_replicas import WholeReplicas
from tidal.server.app import create_app
from tidal.wire.discovery import ServerInfo, clear_server_info, write_server_info
from tidal.wire.teams_file import load_teams

__all__ = ["ApiServer", "AutoscaleUnsupported", "ServerConfig", "run_server"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerConfig:
    """What ``tidal server`` was asked for."""

    data_dir: Path
    #: Virtual CPU slots; ``None`` detects GPUs (or uses one slot per core).
    slots: int | None = None
    policy: str = "fairshare"
    #: Constructor arguments of the policy, as text (``--policy-option K=V``).
    policy_options: Mapping[str, str] = field(default_factory=dict)
    backend: str = "local"
    host: str = "127.0.0.1"
    port: int = 0
    #: Any SQLAlchemy URL; ``None`` is a SQLite file in ``data_dir``.
    db_url: str | None = None
    interval: float = 0.5
    #: Resource group and node labels of this host (jobs may target them).
    group: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Extra arguments for the backend's factory, by name (e.g. ``ray_address``); a
    #: factory receives those it declares.
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    #: Each worker's log is rotated when it would pass this many bytes (0: never) …
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES
    #: … keeping this many earlier files (0: a full log starts over).
    log_backups: int = DEFAULT_LOG_BACKUPS
    #: A teams file (``--teams``): the policy is shared over its team queues.
    teams_file: Path | None = None
    #: Resource groups over the hosts (``--config``); ``None``: the hosts as reported.
    groups: ClusterConfig | None = None
    #: Tell the backend's cluster how many slots the jobs would use (``--autoscale``).
    autoscale: bool = False
    #: The most slots asked for in all (``--max-slots``; ``None``: no cap).
    max_slots: int | None = None
    #: The local backend's standby agent's warm interpreters (``--standby-workers``;
    #: ``None``: sized by the host's slots and free memory; 0: no standby).
    standby_workers: int | None = None


class AutoscaleUnsupported(PluginError):
    """``--autoscale`` with a backend whose cluster cannot grow on request."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt like SIGINT, so cleanup runs whichever stops us."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Server(uvicorn.Server):
    """uvicorn telling the app when its shutdown begins (``app.state.stopping``)."""

    def __init__(self, config: uvicorn.Config, stopping: threading.Event | None) -> None:
        super().__init__(config)
        self._stopping = stopping

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Tell the app first: its open streams end, so the connections close now."""
        if self._stopping is not None:
            self._stopping.set()
        await super().shutdown(sockets)


class ApiServer:
    """uvicorn on a socket bound up front, so port 0 yields a real port to report."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY on accepted connections only
        # when the listening socket says TCP, and without it every keep-alive response
        # waits ~40 ms for a delayed ACK.
        self._sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        # Listening now means early clients queue instead of being refused.
        self._sock.listen(128)
        real_port = self._sock.getsockname()[1]
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        self.url = f"http://{shown}:{real_port}"
        # No proxy headers: clients reach the server directly, and reading them is work
        # on every request.
        config = uvicorn.Config(
            app,
            log_level="warning",
            timeout_graceful_shutdown=3,
            access_log=False,
            proxy_headers=False,
        )
        self._server = _Server(config, getattr(app.state, "stopping", None))
        self._thread: threading.Thread | None = None

    def serve(self) -> None:
        """Serve until interrupted (SIGINT/SIGTERM when called from the main thread).

        Returns normally after a graceful shutdown, so callers' cleanup runs.
        """
        # uvicorn re-raises the signal it shut down for; by then the shutdown is done.
        with _sigterm_as_interrupt(), suppress(KeyboardInterrupt):
            self._server.run(sockets=[self._sock])

    def start(self, timeout: float = 10.0) -> None:
        """Serve from a background thread; returns once requests are being answered."""
        self._thread = threading.Thread(target=self.serve, name="tidal-api", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("API server did not start")
            time.sleep(0.01)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and wait (bounded) for the thread to end."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._sock.close()


#: Called once the server is up, with its URL and a one-time login link to its dashboard.
OnReady = Callable[[str, str], None]


def run_server(config: ServerConfig, on_ready: OnReady | None = None) -> None:
    """Run controller and API until interrupted; ``on_ready(url, login_link)`` once both
    are up (the link logs a browser in once, within minutes: ``tidal.dashboard.login_links``).

    SIGINT and SIGTERM both end it through ``KeyboardInterrupt`` (possibly raised before
    serving began), after the store, backend and server record are cleaned up.
    """
    # Everything the server writes into the data dir is its owner's only.
    with _sigterm_as_interrupt(), private_files():
        _run_server(config, on_ready)


def team_policy(policy: Policy, teams: Sequence[Team], cluster: ClusterModel) -> Policy:
    """``policy`` shared over ``teams``' queues, whose guarantees must fit ``cluster``
    (:class:`~tidal.policy.teams.TeamQuotaError` naming the teams otherwise)."""
    check_quotas(teams, pool_capacity(cluster.to_policy()))
    # Whole replicas within each team: a team's slots are what its replicas are made of.
    return TeamQueues(WholeReplicas(policy), teams)


def _run_server(config: ServerConfig, on_ready: OnReady | None) -> None:
    # Everything that can be refused is checked before anything is written to the data dir.
    policy = load_policy(config.policy, config.policy_options)
    teams = load_teams(config.teams_file) if config.teams_file is not None else None
    cluster = detect_local(
        config.slots,
        group=config.group,
        labels=config.labels,
        address=local_address(config.host),
    )
    if config.groups is not None:
        cluster = ClusterModel(hosts=apply_groups(cluster.hosts, config.groups))
    # One server per store: a second one is refused here, before the backend re-attaches
    # to the first one's agents or anything in the data dir changes.
    with hold_store(config.data_dir, config.db_url) as lock:
        _serve(config, on_ready, lock, policy, cluster, teams)


#: Seconds between checks that the server still holds its store's lock.
LOCK_CHECK_INTERVAL = 2.0


def _watch_lock(lock: StoreLock, done: threading.Event) -> None:
    """Keep the store's lock (taking back a database lock a restart of the database
    dropped); if another server took it meanwhile, stop this one as SIGTERM would: two
    servers must not write one store."""
    while not done.wait(LOCK_CHECK_INTERVAL):
        holder = lock.keep()
        if holder is not None:
            log.error("%s took this store: stopping", holder.describe())
            os.kill(os.getpid(), signal.SIGTERM)
            return


def _serve(
    config: ServerConfig,
    on_ready: OnReady | None,
    lock: StoreLock,
    policy: Policy,
    cluster: ClusterModel,
    teams: Sequence[Team] | None = None,
) -> None:
    options = dict(config.backend_options)
    if config.backend == "local":
        standby = plan_standby(
            requested=config.standby_workers,
            host_slots=cluster.total_slots,
            available_bytes=available_memory(),
        )
        log.info("standby agent: %d warm interpreter(s) (%s)", standby.size, standby.reason)
        options["standby_workers"] = standby.size
    backend = load_backend(config.backend, data_dir=config.data_dir, gpus=cluster.gpu, **options)
    try:
        if config.autoscale and not isinstance(backend, ClusterScaling):
            raise AutoscaleUnsupported(
                f"backend {config.backend!r} cannot grow its cluster (use --backend ray)"
            )
        if isinstance(backend, HostDiscovery):
            # The backend knows the cluster (e.g. Ray's nodes): its hosts, not this one's.
            if config.slots is not None:
                log.warning("--slots is ignored: backend %s reports its hosts", config.backend)
            cluster = ClusterModel.from_hosts(backend.hosts())
            if config.groups is not None:
                cluster = ClusterModel(hosts=apply_groups(cluster.hosts, config.groups))
        if teams is not None:
            policy = team_policy(policy, teams, cluster)
        data_dir = config.data_dir
        token = ensure_token(data_dir)
        store = JobStore(config.db_url) if config.db_url else JobStore.open(data_dir)
        try:
            files = JobFiles(
                data_dir, log_max_bytes=config.log_max_bytes, log_backups=config.log_backups
            )
            scaling = (
                ClusterRequests(backend, store, config.max_slots)
                if config.autoscale and isinstance(backend, ClusterScaling)
                else None
            )
            controller = Controller(
                store,
                cluster,
                policy,
                backend,
                data_dir,
                files=files,
                groups=config.groups,
                scaling=scaling,
            )
            key = ServerKey.in_data_dir(data_dir)
            app = create_app(controller, token, key)
            server = ApiServer(app, config.host, config.port)
            lock.record(server.url)
            pid = os.getpid()
            controller.start(config.interval)
            watching = threading.Event()
            threading.Thread(
                target=_watch_lock, args=(lock, watching), name="tidal-store-lock", daemon=True
            ).start()
            try:
                write_server_info(data_dir, ServerInfo(url=server.url, pid=pid))
                log.info(
                    "serving %s (policy %s, %d slots)", server.url, policy.name, cluster.total_slots
                )
                if on_ready is not None:
                    admin = app.state.auth.identify(token)
                    link = app.state.login_links.make(server.url, admin) if admin else None
                    on_ready(server.url, link.url if link else "")
                server.serve()
            finally:
                watching.set()
                controller.stop()
                clear_server_info(data_dir, pid)
        finally:
            store.close()
    finally:
        backend.close()
