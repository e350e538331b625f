"""``tidal workers launch | await | stop``: the SDK's worker verbs on the command line.

Workers are the replicas of an ordinary job, named ``<job id>/<index>``
(:mod:`tidal.client.worker_verbs`). Importing this module stays light (``tidal --help``):
the SDK loads inside the verbs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from tidal.cli.options import (
    ClientOptions,
    call,
    emit_json,
    fail,
    out,
    pairs,
    with_client_options,
)
from tidal.cli.table_style import plain_table

__all__ = ["workers_app"]

workers_app = typer.Typer(
    help="Launch workers (one job's replicas), wait for them, stop them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

IdsArg = Annotated[
    list[str], typer.Argument(metavar="IDS...", help="Worker ids JOB/INDEX, as launch prints them.")
]


def _checked(action: Callable[[], Any]) -> Any:
    """Run an SDK call; a bad argument is one line naming it, with exit status 2."""
    from tidal.client.workers import WorkerArgumentError

    def guarded() -> Any:
        try:
            return action()
        except WorkerArgumentError as exc:
            fail(str(exc), 2)

    return call(guarded, "")


def _gib_or_size(memory: str | None) -> float | str | None:
    """``--memory 0.5`` is GiB, as the SDK's number is; ``--memory 512Mi`` has its unit."""
    try:
        return float(memory) if memory is not None else None
    except ValueError:
        return memory


@workers_app.command("launch")
@with_client_options()
def launch(
    options: ClientOptions,
    n: Annotated[int, typer.Argument(metavar="N", help="How many workers.")],
    command: Annotated[
        str | None, typer.Option(help="What each worker runs (split like a shell would).")
    ] = None,
    script: Annotated[
        str | None, typer.Option(help="Or: a Python script each worker runs.")
    ] = None,
    code: Annotated[str | None, typer.Option(help="Or: Python code each worker runs.")] = None,
    cpus: Annotated[float, typer.Option(help="CPUs per worker.")] = 1.0,
    memory: Annotated[
        str | None, typer.Option(help="Memory per worker, e.g. 2Gi (a bare number: GiB).")
    ] = None,
    gpus: Annotated[int, typer.Option(help="GPUs per worker.")] = 0,
    env: Annotated[
        list[str] | None, typer.Option(help="KEY=VALUE in each worker's environment, repeatable.")
    ] = None,
    name: Annotated[str, typer.Option(help="Name of the workers' job.")] = "workers",
    role: Annotated[str, typer.Option(help="Role name of the workers.")] = "worker",
) -> None:
    """Start N workers (one job of N fixed replicas) and print their ids."""
    variables = pairs(env, "--env")
    client = options.client()
    ids: list[str] = _checked(
        lambda: client.launch_workers(
            n,
            cpu=cpus,
            memory=_gib_or_size(memory),
            gpus=gpus,
            script=script or "",
            code=code or "",
            command=command,
            env=variables,
            role=role,
            name=name,
        )
    )
    if options.as_json:
        emit_json(ids)
    else:
        for worker in ids:
            out.print(worker, markup=False)


@workers_app.command("await")
@with_client_options()
def await_(
    options: ClientOptions,
    ids: IdsArg,
    completion: Annotated[
        bool, typer.Option("--completion", help="Wait for them to exit, not only to run.")
    ] = False,
    timeout: Annotated[float, typer.Option(min=0, help="Seconds to wait at most.")] = 60.0,
) -> None:
    """Wait for workers to run (or to exit); exit status 1 if any failed or timed out."""
    client = options.client()
    result: dict[str, Any] = _checked(
        lambda: client.await_workers(ids, wait_for_completion=completion, timeout_seconds=timeout)
    )
    if options.as_json:
        emit_json(result)
    else:
        table = plain_table("WORKER", "STATUS", "HOST", "SLOT", "IP", "EXIT")
        failed = set(result["failures"])
        for w in result["workers"]:
            status = w["status"] + (" (failure)" if w["id"] in failed else "")
            table.add_row(
                w["id"],
                status,
                w["host"] or "-",
                "-" if w["slot"] is None else str(w["slot"]),
                w["ip_address"] or "-",
                "-" if w["exit_code"] is None else str(w["exit_code"]),
            )
        out.print(table)
    if result["failures"]:
        raise typer.Exit(1)


@workers_app.command("stop")
@with_client_options()
def stop(options: ClientOptions, ids: IdsArg) -> None:
    """Stop workers: all of a job's (it ends cancelled) or some (it runs on without them)."""
    client = options.client()
    jobs: list[str] = _checked(lambda: client.stop_workers(ids))
    if options.as_json:
        emit_json({"stopped": jobs})
    else:
        for job in jobs:
            out.print(f"{job}: stop requested", markup=False)
