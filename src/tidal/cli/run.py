"""``tidal run`` and ``tidal resize``: one elastic job on this machine, without a server.

``tidal resize`` is to a ``tidal run`` what ``tidal scale`` is to a server's job: it asks
the run's rendezvous store (found through :mod:`tidal.launch.runs`) for a new size.
Importing this module stays light (``tidal --help``): the launcher, and torch with it,
load inside the verbs, after their arguments are checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

# typer ships its own copy of click; its exceptions are the ones raised here.
from typer._click.exceptions import UsageError

from tidal.cli.options import workers_count

__all__ = ["resize_command", "run_command", "runs_app"]

#: ``tidal run`` and ``tidal resize``, added to the ``tidal`` app by :mod:`tidal.cli.main`.
runs_app = typer.Typer()
console = Console(stderr=True)


@runs_app.command(
    "run",
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
)
def run_command(
    command: Annotated[list[str], typer.Argument(help="SCRIPT [ARGS...]: what each worker runs")],
    workers: Annotated[str, typer.Option(help="MIN:MAX workers (or N)")] = "1:1",
    initial: Annotated[
        int | None, typer.Option(help="workers at start", show_default="MAX")
    ] = None,
    max_restarts: Annotated[int, typer.Option(help="failures to recover from")] = 3,
    run_id: Annotated[str | None, typer.Option(help="name of this run")] = None,
    checkpoint_dir: Annotated[Path | None, typer.Option(help="durable checkpoints here")] = None,
    checkpoint_every: Annotated[int, typer.Option(help="checkpoint every N steps (0: never)")] = 0,
    checkpoint_every_seconds: Annotated[
        float, typer.Option(help="checkpoint every S seconds (0: never)")
    ] = 0.0,
    timeout: Annotated[
        float | None,
        typer.Option(
            help="seconds before a silent peer is dead", show_default="$TIDAL_TIMEOUT or 10"
        ),
    ] = None,
    sync_every: Annotated[
        int | None,
        typer.Option(
            help="agree on membership every K steps", show_default="$TIDAL_SYNC_EVERY or 1"
        ),
    ] = None,
    log_dir: Annotated[Path | None, typer.Option(help="also write each worker's log here")] = None,
    resize_at: Annotated[str, typer.Option(help="scripted resizes: STEP:N[,STEP:N...]")] = "",
    launcher: Annotated[
        str,
        typer.Option(
            help="tidal (in-place resize) or torchrun (torchrun's environment for an "
            "unmodified script; restart-based resize)"
        ),
    ] = "tidal",
    stop_grace: Annotated[
        float, typer.Option(help="torchrun: seconds from SIGTERM to SIGKILL at a restart")
    ] = 30.0,
) -> None:
    """Run SCRIPT on MIN..MAX local workers that grow and shrink while they train."""
    # The arguments are checked before the launcher (and torch with it) loads.
    from tidal.launch.run_args import (
        UsageProblem,
        check_launcher,
        parse_resize_plan,
        parse_workers,
        worker_argv,
    )
    from tidal.runtime.env import ConfigError, RuntimeConfig

    try:
        worker_argv(list(command))
        low, high = parse_workers(workers)
        start = high if initial is None else initial
        if not low <= start <= high:
            raise UsageProblem(
                f"--initial: expected a value within --workers {low}:{high}, got {start}"
            )
        if max_restarts < 0:
            raise UsageProblem(f"--max-restarts: expected an integer >= 0, got {max_restarts}")
        try:
            defaults = RuntimeConfig.from_env()
        except ConfigError as exc:
            raise UsageProblem(str(exc)) from None
        timeout = defaults.timeout if timeout is None else timeout
        sync_every = defaults.sync_every if sync_every is None else sync_every
        if timeout <= 0:
            raise UsageProblem(f"--timeout: expected seconds > 0, got {timeout}")
        if sync_every < 1:
            raise UsageProblem(f"--sync-every: expected an integer >= 1, got {sync_every}")
        if checkpoint_every < 0:
            raise UsageProblem(
                f"--checkpoint-every: expected an integer >= 0, got {checkpoint_every}"
            )
        if checkpoint_every_seconds < 0:
            raise UsageProblem(
                f"--checkpoint-every-seconds: expected seconds >= 0, got {checkpoint_every_seconds}"
            )
        check_launcher(
            launcher,
            stop_grace=stop_grace,
            given={
                "--resize-at": bool(resize_at),
                "--sync-every": sync_every != defaults.sync_every,
                "--checkpoint-dir": checkpoint_dir is not None,
                "--checkpoint-every": checkpoint_every != 0,
                "--checkpoint-every-seconds": checkpoint_every_seconds != 0,
            },
        )
        resize_plan = parse_resize_plan(resize_at, low, high)
        from tidal.launch.run import RunOptions, run

        options = RunOptions(
            command=list(command),
            min_workers=low,
            max_workers=high,
            initial=start,
            max_restarts=max_restarts,
            checkpoint_dir=str(checkpoint_dir) if checkpoint_dir else None,
            checkpoint_every=checkpoint_every,
            checkpoint_every_seconds=checkpoint_every_seconds,
            timeout=timeout,
            sync_every=sync_every,
            log_dir=log_dir,
            resize_plan=resize_plan,
            launcher=launcher,
            stop_grace=stop_grace,
        )
        if run_id:
            options.run_id = run_id
        code = run(options, console)
    except UsageProblem as exc:
        # Reported by main() as every usage error is: one line, exit status 2.
        raise UsageError(str(exc)) from None
    raise typer.Exit(code)


@runs_app.command("resize")
def resize_command(
    run_id: Annotated[str, typer.Argument(help="the run, as `tidal run` printed it")],
    n: Annotated[
        int | None,
        typer.Argument(
            metavar="N", help="how many workers the run should have", show_default=False
        ),
    ] = None,
    workers: Annotated[int | None, typer.Option(help="the same as N", show_default=False)] = None,
) -> None:
    """Ask a running `tidal run` for N workers.

    What `tidal scale` is to a server's job, for a run of `tidal run` (no server).
    """
    count, given = workers_count(n, workers)  # before torch loads with the store's client
    from tidal.launch.runs import lookup
    from tidal.runtime.rendezvous import connect_store, request_resize

    record = lookup(run_id)
    if record is None:
        raise UsageError(f"RUN: no running run with id {run_id!r}")
    if not record.min_workers <= count <= record.max_workers:
        raise UsageError(
            f"{given}: expected a value within {record.min_workers}:{record.max_workers}, "
            f"got {count}"
        )
    host, _, port = record.store.rpartition(":")
    seq = request_resize(connect_store(host, int(port), timeout=10), count)
    console.print(f"asked run {run_id} for {count} workers (request {seq})", highlight=False)
