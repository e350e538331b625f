"""``tidal server``: run the controller and its REST API.

Importing this module stays light (``tidal --help``): FastAPI, uvicorn and SQLAlchemy load
inside the verb.
"""

from __future__ import annotations

import gc
import logging
import threading
from pathlib import Path
from typing import Annotated

import typer

from tidal.cli.options import (
    ClientOptions,
    DataDirOpt,
    call,
    controller_app,
    emit_json,
    err,
    fail,
    out,
    pairs,
    with_client_options,
)
from tidal.launch.log_sink import DEFAULT_LOG_BACKUPS, DEFAULT_LOG_MAX_BYTES
from tidal.policy.registry import SERVED
from tidal.wire.discovery import default_data_dir

__all__ = ["GC_YOUNG_THRESHOLD", "SERVER_DONE", "login_link", "server"]

#: Set once a server verb has stopped and cleaned up (store closed, jobs released, its
#: record removed). The entry point then exits at once: tearing down the interpreter of a
#: process that loaded torch, FastAPI and SQLAlchemy took seconds more after SIGTERM, with
#: nothing left to clean.
SERVER_DONE = threading.Event()

#: Allocations between two collections of the youngest objects in the server's process
#: (Python's default: 700).
GC_YOUNG_THRESHOLD = 10_000


@controller_app.command()
def server(
    slots: Annotated[
        int | None,
        typer.Option(min=1, help="Virtual CPU slots.", show_default="one per GPU, else per core"),
    ] = None,
    data_dir: DataDirOpt = None,
    policy: Annotated[
        str, typer.Option(help=f"{', '.join(SERVED)}, or module:Class.")
    ] = "fairshare",
    policy_option: Annotated[
        list[str] | None,
        typer.Option(help="Policy argument KEY=VALUE, e.g. reallocation_delay=10; repeatable."),
    ] = None,
    backend: Annotated[str, typer.Option(help="local, ray, or module:Class.")] = "local",
    ray_address: Annotated[
        str | None,
        typer.Option(help="With --backend ray: the cluster to join (ADDRESS or auto)."),
    ] = None,
    autoscale: Annotated[
        bool,
        typer.Option(
            "--autoscale",
            help="With --backend ray: ask Ray's autoscaler for the slots the jobs would use.",
        ),
    ] = False,
    max_slots: Annotated[
        int | None,
        typer.Option(min=1, help="With --autoscale: the most slots to ask for in all."),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="0 picks a free port.")] = 0,
    db_url: Annotated[
        str | None,
        typer.Option(help="SQLAlchemy URL.", show_default="SQLite in the data dir"),
    ] = None,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between ticks.")] = 0.5,
    group: Annotated[str | None, typer.Option(help="Resource group of this host.")] = None,
    label: Annotated[
        list[str] | None, typer.Option(help="Node label KEY=VALUE of this host, repeatable.")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="Server config (YAML): resource groups over the hosts."),
    ] = None,
    log_max_mb: Annotated[
        int,
        typer.Option(min=0, help="Rotate each worker's log past this many MiB (0: never)."),
    ] = DEFAULT_LOG_MAX_BYTES >> 20,
    log_backups: Annotated[
        int,
        typer.Option(min=0, help="Rotated logs kept per worker (0: a full log starts over)."),
    ] = DEFAULT_LOG_BACKUPS,
    teams: Annotated[
        Path | None,
        typer.Option(help="YAML file of team queues: guaranteed slots, weights, limits."),
    ] = None,
    standby_workers: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Warm interpreters of the agent kept ready for the next job, local "
            "backend (0: none).",
            show_default="one per slot up to 4, as memory allows",
        ),
    ] = None,
) -> None:
    """Run the controller and its REST API until interrupted."""
    if autoscale and backend == "local":
        raise typer.BadParameter(
            f"needs --backend ray (it asks Ray's autoscaler for nodes), not {backend!r}",
            param_hint="--autoscale",
        )
    if max_slots is not None and not autoscale:
        raise typer.BadParameter("only with --autoscale", param_hint="--max-slots")
    labels = pairs(label, "--label")
    policy_options = pairs(policy_option, "--policy-option")
    # Heavy (FastAPI, uvicorn, SQLAlchemy): only for this verb.
    from tidal.controller.plugins import PluginError
    from tidal.controller.resource_groups import ClusterConfigError, load_cluster_config
    from tidal.controller.store.server_lock import StoreLocked
    from tidal.dashboard.login_links import LINK_TTL_S
    from tidal.policy.teams import TeamQuotaError
    from tidal.server.process import AutoscaleUnsupported, ServerConfig, run_server
    from tidal.wire.discovery import TOKEN_FILE, read_token
    from tidal.wire.teams_file import TeamsFileError

    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,  # the top-level CLI set WARNING already; the server logs at INFO
    )
    # Alembic tells every step of creating or upgrading the store at INFO (ten lines at a
    # first start); the store says itself when it upgrades one.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    groups = None
    if config is not None:
        try:
            groups = load_cluster_config(config)
        except ClusterConfigError as exc:
            fail(f"--config {config}: {exc}", code=2)
    folder = data_dir or default_data_dir()
    server_config = ServerConfig(
        data_dir=folder,
        slots=slots,
        policy=policy,
        policy_options=policy_options,
        backend=backend,
        host=host,
        port=port,
        db_url=db_url,
        interval=interval,
        group=group,
        labels=labels,
        backend_options={"ray_address": ray_address} if ray_address else {},
        log_max_bytes=log_max_mb << 20,
        log_backups=log_backups,
        teams_file=teams,
        groups=groups,
        autoscale=autoscale,
        max_slots=max_slots,
        standby_workers=standby_workers,
    )

    # The token is shown once, when this start creates it: the dashboard's login asks for it.
    first_start = read_token(folder) is None

    def ready(url: str, login_link: str) -> None:
        out.print(
            f"tidal server on [bold]{url}[/] (data in {folder}); Ctrl-C to stop", soft_wrap=True
        )
        token = read_token(folder) if first_start else None
        where = f"token: [bold]{token}[/]" if token else f"token in {folder / TOKEN_FILE}"
        out.print(f"dashboard: [bold]{url}/[/] ({where})", soft_wrap=True, highlight=False)
        if not login_link:  # the data dir's token is revoked: no link logs in as admin
            return
        # The link on a line of its own: whole for a terminal to open it, whatever the width.
        out.print(
            f"log in once within {LINK_TTL_S / 60:.0f} minutes (`tidal login-link` makes more):",
            highlight=False,
            markup=False,
        )
        out.print(f"  {login_link}", soft_wrap=True, highlight=False, markup=False)

    # This process is the server's alone: what it loaded to start lives as long as it
    # does, and it keeps many objects for good (the store's records, the listing's JSON),
    # so the collector skips the former and looks at young objects less often.
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    try:
        run_server(server_config, on_ready=ready)
        SERVER_DONE.set()
    except KeyboardInterrupt:
        SERVER_DONE.set()
    except StoreLocked as exc:
        fail(str(exc))
    except (TeamsFileError, TeamQuotaError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--teams") from None
    except AutoscaleUnsupported as exc:
        raise typer.BadParameter(str(exc), param_hint="--autoscale") from None
    except PluginError as exc:
        hint = "--policy" if "policy" in str(exc) else "--backend"
        raise typer.BadParameter(str(exc), param_hint=hint) from None
    except OSError as exc:
        fail(f"cannot serve on {host}:{port}: {exc.strerror or exc}")


@controller_app.command()
@with_client_options()
def login_link(options: ClientOptions) -> None:
    """Print a link that logs a browser into the dashboard once, within minutes (for a
    screenshot script, or to open from the terminal): the token stays out of the URL."""
    import time

    client = options.client()
    link = call(client.login_link)
    if options.as_json:
        emit_json(link)
        return
    # The URL alone on stdout, for scripts; when it stops working on stderr, for people.
    out.print(link.url, soft_wrap=True, markup=False, highlight=False)
    left = max(0, round((link.expires_at - time.time()) / 60))
    err.print(f"good for one login, within {left} minute(s)", markup=False)
