"""The controller's CLI: the verbs registered on one typer app, and the entry point.

The verbs live in their own modules (``server_cli``, ``submit_cli``, ``jobs_cli``,
``cluster_cli``, ``workers_cli``) and register on
:data:`~tidal.controller.cli_options.controller_app`, with the options and output helpers
of :mod:`tidal.controller.cli_options`; this module imports them in the order the help
lists them. Output is rich tables for people (:mod:`tidal.controller.cli_tables`) and
``--json`` for scripts. Importing this module stays light (``tidal --help``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import typer
from typer.exceptions import TyperException

# The verb modules register on the app as they are imported, in this order (the help's):
# `tidal server`, `tidal submit` and `tidal export`, the verbs on jobs, `tidal cluster`
# and `tidal top`, then `tidal workers launch | await | stop`. Sorting them would reorder
# the help.
# isort: off
from tidal.controller import server_cli as _server_cli  # noqa: F401
from tidal.controller import submit_cli as _submit_cli  # noqa: F401
from tidal.controller import jobs_cli as _jobs_cli  # noqa: F401
from tidal.controller import cluster_cli as _cluster_cli  # noqa: F401

# isort: on
from tidal.controller.cli_options import controller_app, err, parse_duration
from tidal.controller.workers_cli import workers_app

__all__ = ["controller_app", "main", "parse_duration", "run_app"]

controller_app.add_typer(workers_app, name="workers")


# -- entry point ---------------------------------------------------------------------------


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


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point."""
    sys.exit(run_app(controller_app, argv))


if __name__ == "__main__":
    main()
