"""``tidal list | get | logs | priority | scale | scale-out | scale-in | cancel``: the verbs
on one job (or the list of them) on the command line.

Importing this module registers the verbs on :data:`tidal.cli.options.controller_app`;
:mod:`tidal.cli.main` imports it in the place of the help's list these verbs take.
Importing it stays light (``tidal --help``): the SDK loads inside the verbs.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from tidal.cli.options import (
    ClientOptions,
    JobArg,
    call,
    controller_app,
    emit_json,
    out,
    pairs,
    parse_duration,
    with_client_options,
    workers_count,
)
from tidal.cli.tables import jobs_table, print_job_detail, target_text

if TYPE_CHECKING:
    from tidal.wire.schema import JobDetail

__all__ = ["cancel", "get", "list_jobs", "logs", "priority", "scale", "scale_in", "scale_out"]


@controller_app.command("list")
@with_client_options()
def list_jobs(
    options: ClientOptions,
    state: Annotated[list[str] | None, typer.Option(help="Filter by state, repeatable.")] = None,
    name: Annotated[str | None, typer.Option(help="Filter by name.")] = None,
    label: Annotated[list[str] | None, typer.Option(help="KEY=VALUE, repeatable.")] = None,
) -> None:
    """List jobs."""
    labels = pairs(label, "--label")
    client = options.client()
    jobs = call(
        lambda: client.list(state=state, name=name, labels=labels, full=options.as_json),
        "--state",
    )
    if options.as_json:
        emit_json(jobs)
    elif not jobs:
        out.print("no jobs")
    else:
        out.print(jobs_table(jobs, out.width))


@controller_app.command()
@with_client_options()
def get(
    options: ClientOptions,
    job: JobArg,
) -> None:
    """Show one job: its state, workers and recent events."""
    client = options.client()
    detail: JobDetail = call(lambda: client.get(job))
    events = call(lambda: client.events(detail.id, limit=10))
    if options.as_json:
        data = detail.model_dump(mode="json")
        data["events"] = [e.model_dump(mode="json") for e in events]
        emit_json(data)
        return
    print_job_detail(out, detail, events)


@controller_app.command()
@with_client_options(json_output=False)
def logs(
    options: ClientOptions,
    job: JobArg,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Stream until the job ends.")
    ] = False,
    tail: Annotated[int, typer.Option(min=0, help="Lines per worker.")] = 100,
    worker: Annotated[int | None, typer.Option(min=0, help="Only this worker.")] = None,
    role: Annotated[
        str | None, typer.Option(help="Only this role's replica (with --index, default 0).")
    ] = None,
    index: Annotated[int | None, typer.Option(min=0, help="The replica of --role.")] = None,
) -> None:
    """Print a job's logs, each line prefixed with its worker."""
    client = options.client()
    if role is not None or index is not None:
        if worker is not None:
            raise typer.BadParameter("give --worker, or --role and --index", param_hint="--role")
        if role is None:
            raise typer.BadParameter("--index needs --role", param_hint="--index")
        from tidal.cli.roles import replica_worker

        detail: JobDetail = call(lambda: client.get(job))
        try:
            worker = replica_worker(detail, role, index or 0)
        except ValueError as exc:
            flag, _, message = str(exc).partition(": ")
            raise typer.BadParameter(message, param_hint=flag) from None
    if not follow:
        sys.stdout.write(call(lambda: client.logs(job, tail=tail, worker=worker)))
        return

    def stream() -> None:
        try:
            for line in client.follow_logs(job, tail=tail, worker=worker):
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
        except KeyboardInterrupt:
            pass

    call(stream)


# A negative priority (`tidal priority JOB -1`) is an argument, not an unknown option.
@controller_app.command(context_settings={"ignore_unknown_options": True})
@with_client_options()
def priority(
    options: ClientOptions,
    job: JobArg,
    value: Annotated[int, typer.Argument(metavar="N", help="New priority (higher wins).")],
) -> None:
    """Change a job's priority."""
    client = options.client()
    view = call(lambda: client.priority(job, value), "N")
    options.show(view, f"{view.id}: priority {view.priority}")


@controller_app.command()
@with_client_options()
def scale(
    options: ClientOptions,
    job: JobArg,
    n: Annotated[
        int | None,
        typer.Argument(metavar="N", min=1, help="Exact number of workers.", show_default=False),
    ] = None,
    workers: Annotated[
        int | None, typer.Option(min=1, help="The same as N.", show_default=False)
    ] = None,
    role: Annotated[
        str | None,
        typer.Option(help="Count replicas of this role (a multi-role job's elastic role)."),
    ] = None,
) -> None:
    """Ask for exactly N workers (within the job's min and max).

    A server's job; `tidal resize` asks the same of a `tidal run`.
    """
    count, given = workers_count(n, workers)
    client = options.client()
    # With --role the server names the field at fault itself (role or workers).
    view = call(lambda: client.scale(job, count, role=role), None if role else given)
    options.show(view, f"{view.id}: {target_text(view)}")


@controller_app.command("scale-out")
@with_client_options()
def scale_out(
    options: ClientOptions,
    job: JobArg,
    count: Annotated[int, typer.Option(min=1, help="Workers to add.")],
    timeout: Annotated[
        str | None, typer.Option(help="Roll back if not reached in time, e.g. 10m.")
    ] = None,
) -> None:
    """Grow a running job by K workers."""
    seconds = None
    if timeout is not None:
        try:
            seconds = parse_duration(timeout)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--timeout") from None
    client = options.client()
    view = call(lambda: client.scale_out(job, count, seconds), "--count")
    options.show(view, f"{view.id}: {target_text(view)}")


@controller_app.command("scale-in")
@with_client_options()
def scale_in(
    options: ClientOptions,
    job: JobArg,
    count: Annotated[int, typer.Option(min=1, help="Workers to remove.")],
) -> None:
    """Shrink a running job by K workers."""
    client = options.client()
    view = call(lambda: client.scale_in(job, count), "--count")
    options.show(view, f"{view.id}: {target_text(view)}")


@controller_app.command()
@with_client_options()
def cancel(
    options: ClientOptions,
    job: JobArg,
    wait: Annotated[bool, typer.Option(help="Wait until the job is cancelled.")] = False,
) -> None:
    """Cancel a job; its workers stop on the controller's next tick."""
    client = options.client()
    view = call(lambda: client.cancel(job))
    if wait:
        view = call(lambda: client.wait(view.id, timeout=60))
    options.show(view, f"{view.id}: {'cancelled' if wait else 'cancel requested'}")
