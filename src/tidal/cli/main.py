"""The ``tidal`` command: every verb on one typer app, and the entry point.

The verbs live in their own modules: ``tidal run`` and ``tidal resize`` (one job on this
machine, no server) in :mod:`tidal.cli.run`; the verbs that talk to a server register on
:data:`~tidal.cli.options.controller_app`, with the options and output helpers of
:mod:`tidal.cli.options`, in :mod:`tidal.cli.server`, :mod:`~tidal.cli.submit`,
:mod:`~tidal.cli.jobs`, :mod:`~tidal.cli.cluster` and :mod:`~tidal.cli.workers`; this
module imports them in the order the help lists them. ``tidal sim`` hands its arguments to
the simulator's verbs. Output is rich tables for people (:mod:`tidal.cli.tables`) and
``--json`` for scripts. Importing this module stays light (``tidal --help``).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

import typer
from rich.console import Console

# typer ships its own copy of click; its exceptions are the ones raised here.
from typer._click.exceptions import UsageError
from typer.exceptions import TyperException

# The verb modules register on the app as they are imported, in this order (the help's):
# `tidal server`, `tidal submit` and `tidal export`, the verbs on jobs, `tidal cluster`
# and `tidal top`, then `tidal workers launch | await | stop`. Sorting them would reorder
# the help.
# isort: off
from tidal.cli import server as _server
from tidal.cli import submit as _submit  # noqa: F401
from tidal.cli import jobs as _jobs  # noqa: F401
from tidal.cli import cluster as _cluster  # noqa: F401
from tidal.cli import datasets as _datasets
from tidal.cli import registry as _registry
from tidal.cli import users as _users

# isort: on
from tidal.cli.options import controller_app, err
from tidal.cli.run import runs_app
from tidal.cli.workers import workers_app

__all__ = ["app", "controller_app", "main", "run_app"]

controller_app.add_typer(workers_app, name="workers")
controller_app.add_typer(_datasets.dataset_app, name="dataset")
controller_app.add_typer(_registry.model_app, name="model")
controller_app.add_typer(_users.user_app, name="user")
controller_app.add_typer(_users.token_app, name="token")

# Help is rich markup for every verb (typer takes the mode of this, the outermost app):
# a default that is not the parameter's value goes in `show_default`, since a `[default:
# ...]` written in a help string reads as a markup tag and vanishes.
app = typer.Typer(
    name="tidal",
    help="Elastic PyTorch training on a shared pool of GPUs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
# Help lists the groups in this order: run and resize, the server's verbs, then sim.
app.add_typer(runs_app)
app.add_typer(controller_app)  # server, submit, list, get, logs, priority, scale, ...
_SIM_HELP = "Replay cluster traces through tidal's policies."
_sim_entry = typer.Typer()


@_sim_entry.command(
    "sim",
    help=_SIM_HELP,
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def sim_command(ctx: typer.Context) -> None:
    """Hand the rest of the command line to the simulator's verbs, imported only here."""
    from tidal.sim.cli import sim_app

    outer = typer.Typer(add_completion=False)
    outer.add_typer(sim_app, name="sim", help=_SIM_HELP)
    command = typer.main.get_command(outer)
    # Errors propagate to main(), which reports them as for every other verb.
    result = command.main(args=["sim", *ctx.args], prog_name="tidal", standalone_mode=False)
    raise typer.Exit(result if isinstance(result, int) else 0)


app.add_typer(_sim_entry)


def main() -> None:
    """Entry point: usage problems are one line on stderr and exit status 2."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    try:
        code = app(standalone_mode=False)
    except UsageError as exc:
        Console(stderr=True).print(
            f"tidal: {exc.format_message()}", highlight=False, markup=False, soft_wrap=True
        )
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(130)
    code = code if isinstance(code, int) else 0
    if _server.SERVER_DONE.is_set():
        # A stopped server has cleaned up: skip the interpreter's teardown (seconds).
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def run_app(app: typer.Typer, argv: Sequence[str] | None = None) -> int:
    """Run a typer app, printing usage errors as one line (exit 2) instead of a help box."""
    command = typer.main.get_command(app)
    args = list(argv) if argv is not None else None
    try:
        result = command.main(args=args, prog_name="tidal", standalone_mode=False)
    except TyperException as exc:
        # Typer's (vendored) click errors: usage errors carry exit code 2, others 1.
        code = int(getattr(exc, "exit_code", 1))
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if code == 2 and ctx is not None else ""
        err.print(f"tidal: {message}{hint}", markup=False)
        return code
    except typer.Abort:
        return 130
    return result if isinstance(result, int) else 0
