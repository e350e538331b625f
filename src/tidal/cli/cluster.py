"""``tidal cluster`` and ``tidal top``: the cluster's hosts and slots, once or live.

Importing this module registers the verbs on :data:`tidal.cli.options.controller_app`;
:mod:`tidal.cli.main` imports it in the place of the help's list these verbs take.
Importing it stays light (``tidal --help``): the SDK loads inside the verbs.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Group
from rich.text import Text

from tidal.cli.options import (
    ClientOptions,
    call,
    controller_app,
    emit_json,
    out,
    parse_duration,
    with_client_options,
)
from tidal.cli.tables import cluster_table, drain_lines, jobs_table, queues_table

if TYPE_CHECKING:
    from tidal.wire.cluster import ClusterView, HostView

__all__ = ["cluster", "drain", "queues", "top", "undrain"]


@controller_app.command()
@with_client_options()
def cluster(
    options: ClientOptions,
) -> None:
    """Show hosts, slots and which jobs hold them."""
    client = options.client()
    view: ClusterView = call(client.cluster)
    if options.as_json:
        emit_json(view)
        return
    out.print(f"policy {view.policy}: {view.used_slots}/{view.total_slots} slots used")
    out.print(cluster_table(view))
    for line in drain_lines(view, time.time()):
        out.print(line, markup=False)


HostArg = Annotated[str, typer.Argument(help="The host's name, as `tidal cluster` shows it.")]


@controller_app.command()
@with_client_options()
def drain(
    options: ClientOptions,
    host: HostArg,
    deadline: Annotated[
        str | None,
        typer.Option(help="The host goes within this long, e.g. 2m or 30s."),
    ] = None,
) -> None:
    """Drain HOST: no new workers; its jobs move off at their next step boundary (a job
    that cannot leave in place checkpoints before the deadline)."""
    seconds = None
    if deadline is not None:
        try:
            seconds = parse_duration(deadline)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--deadline") from None
    client = options.client()
    view = call(lambda: client.drain(host, seconds))
    still = view.draining.remaining if view.draining is not None else []
    on_it = f"; moving off it: {', '.join(still)}" if still else ""
    _show(options, view, f"{view.name}: draining{on_it}")


@controller_app.command()
@with_client_options()
def undrain(options: ClientOptions, host: HostArg) -> None:
    """Take a drained HOST back into service."""
    client = options.client()
    view = call(lambda: client.undrain(host))
    _show(options, view, f"{view.name}: in service")


def _show(options: ClientOptions, view: HostView, message: str) -> None:
    if options.as_json:
        emit_json(view)
    else:
        out.print(message, markup=False)


@controller_app.command()
@with_client_options()
def queues(
    options: ClientOptions,
) -> None:
    """Show each team's queue: guaranteed slots, limit, and what it uses, borrows, lends."""
    client = options.client()
    views = call(client.queues)
    if options.as_json:
        emit_json(views)
        return
    if not views:
        out.print("no team queues: the server runs without --teams")
        return
    out.print(queues_table(views))


@controller_app.command()
@with_client_options(json_output=False)
def top(
    options: ClientOptions,
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between refreshes.")] = 1.0,
    iterations: Annotated[int, typer.Option(min=0, hidden=True)] = 0,
) -> None:
    """A live view of the cluster and its jobs (Ctrl-C to leave); one snapshot when the
    output is not a terminal."""
    from rich.live import Live

    client = options.client()

    def frame() -> Group:
        view: ClusterView = call(client.cluster)
        jobs = call(lambda: client.list(state=["queued", "running", "rescaling"]))
        head = Text(
            f"tidal {client.url}  policy {view.policy}  "
            f"{view.used_slots}/{view.total_slots} slots used  {len(jobs)} active job(s)",
            style="bold",
        )
        return Group(head, cluster_table(view), Text(""), jobs_table(jobs, out.width))

    if not out.is_terminal:
        # Piped or redirected: a live view would write nothing until it ends; one
        # snapshot is what a script or a log file can use.
        out.print(frame())
        return
    count = 0
    try:
        with Live(frame(), console=out, auto_refresh=False) as live:
            while iterations == 0 or count < iterations:
                count += 1
                if iterations and count >= iterations:
                    break
                time.sleep(interval)
                live.update(frame(), refresh=True)
    except KeyboardInterrupt:
        pass
