"""The controller's CLI: its typer app, the options its verbs share, and the entry point.

The verbs live in their own modules (``server_cli``, ``submit_cli``, ``jobs_cli``,
``cluster_cli``, ``workers_cli``), which register on :data:`controller_app`; this module
imports them. Output is rich tables for people (:mod:`tidal.controller.cli_tables`) and
``--json`` for scripts. Bad input is one line on stderr naming the argument, with exit
status 2; a refusal by the server exits 1. The verbs that talk to a server share ``--url``,
``--token``, ``--data-dir`` and ``--json`` through :func:`with_client_options`. Importing
this module stays light (``tidal --help``): the SDK, pydantic and the server load inside the
verbs.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from typer.exceptions import TyperException

if TYPE_CHECKING:
    from tidal.client import Client
    from tidal.controller.schema import JobView

__all__ = [
    "ClientOptions",
    "controller_app",
    "main",
    "parse_duration",
    "run_app",
    "with_client_options",
]

log = logging.getLogger(__name__)

controller_app = typer.Typer(
    help="Share a pool of GPUs among elastic PyTorch training jobs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

_out = Console(highlight=False)
_err = Console(stderr=True, highlight=False, soft_wrap=True)

# -- shared options ------------------------------------------------------------------------

DataDirOpt = Annotated[
    Path | None,
    typer.Option("--data-dir", help="Server data dir (default: $TIDAL_DATA_DIR or ~/.tidal)."),
]
UrlOpt = Annotated[
    str | None, typer.Option("--url", envvar="TIDAL_URL", help="Server URL (else from data dir).")
]
TokenOpt = Annotated[
    str | None, typer.Option("--token", envvar="TIDAL_TOKEN", help="Token (else from data dir).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON output.")]
JobArg = Annotated[str, typer.Argument(help="Job id (or name: the latest job with it).")]


def _fail(message: str, code: int = 1) -> NoReturn:
    _err.print(f"tidal: {message}", markup=False)
    raise typer.Exit(code)


@dataclass(frozen=True)
class ClientOptions:
    """How a verb reaches the server and prints its answer: ``--url``, ``--token``,
    ``--data-dir`` and (for verbs that print a result) ``--json``."""

    url: str | None = None
    token: str | None = None
    data_dir: Path | None = None
    as_json: bool = False

    def client(self) -> Client:
        """An SDK client for the server these options name (exit 1 if none is found)."""
        from tidal.client import Client, ClientError

        try:
            return Client(url=self.url, token=self.token, data_dir=self.data_dir)
        except ClientError as exc:
            _fail(str(exc))

    def show(self, view: JobView, message: str) -> None:
        """Print a changed job: ``message`` for people, the job as JSON with ``--json``."""
        if self.as_json:
            _emit_json(view)
        else:
            _out.print(message, markup=False)


#: The command-line parameters behind :class:`ClientOptions`, in the order help lists them.
_CLIENT_PARAMETERS = {
    name: inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)
    for name, kind, default in (
        ("url", UrlOpt, None),
        ("token", TokenOpt, None),
        ("data_dir", DataDirOpt, None),
        ("as_json", JsonOpt, False),
    )
}


def with_client_options(
    *, json_output: bool = True
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a verb the shared options: it takes ``options: ClientOptions`` and its command
    line gets ``--url``, ``--token``, ``--data-dir`` (and ``--json``) after its own."""
    shared = [n for n in _CLIENT_PARAMETERS if json_output or n != "as_json"]

    def decorate(verb: Callable[..., None]) -> Callable[..., None]:
        own = inspect.signature(verb, eval_str=True)
        parameters = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in own.parameters.values()
            if p.name != "options"
        ] + [_CLIENT_PARAMETERS[n] for n in shared]

        def command(**values: Any) -> None:
            options = ClientOptions(**{n: values.pop(n) for n in shared})
            verb(options=options, **values)

        # typer reads the command's name, help and parameters from these.
        command.__name__ = verb.__name__
        command.__qualname__ = verb.__qualname__
        command.__doc__ = verb.__doc__
        command.__module__ = verb.__module__
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        command.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
        return command

    return decorate


def _call(action: Callable[[], Any], arg: str | None = None) -> Any:
    """Run one SDK call, turning its errors into one-line messages and exit codes."""
    from tidal.client import ClientError, InvalidRequest, NotFound

    try:
        return action()
    except InvalidRequest as exc:
        where = f"{arg}: " if arg else ""
        _fail(f"{where}{exc}", 2)
    except NotFound as exc:
        _fail(str(exc))
    except ClientError as exc:
        _fail(str(exc))


def _emit_json(data: Any) -> None:
    from pydantic import BaseModel

    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    elif isinstance(data, list):
        data = [d.model_dump(mode="json") if isinstance(d, BaseModel) else d for d in data]
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def _pairs(values: Sequence[str] | None, option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected KEY=VALUE (got {item!r})", param_hint=option)
        out[key] = value
    return out


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds from ``90``, ``30s``, ``10m``, ``2h``; ``ValueError`` otherwise."""
    match = _DURATION_RE.match(text)
    if not match:
        raise ValueError(f"not a duration (got {text!r}; use e.g. 30s, 10m, 1h)")
    seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]
    if seconds <= 0:
        raise ValueError(f"must be positive (got {text!r})")
    return seconds


# -- verbs -------------------------------------------------------------------------------


# The verbs live in their own modules; importing each registers its verbs on
# controller_app, in the order the help lists them (they use the shared options above,
# hence mid-module): `tidal server`, `tidal submit` and `tidal export`, the verbs on jobs,
# `tidal cluster` and `tidal top`, then `tidal workers launch | await | stop`. Sorting them
# would reorder the help.
# isort: off
from tidal.controller import server_cli as _server_cli  # noqa: E402, F401
from tidal.controller import submit_cli as _submit_cli  # noqa: E402, F401
from tidal.controller import jobs_cli as _jobs_cli  # noqa: E402, F401
from tidal.controller import cluster_cli as _cluster_cli  # noqa: E402, F401

# isort: on
from tidal.controller.workers_cli import workers_app  # noqa: E402

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
        _err.print(f"tidal: {message}{hint}", markup=False)
        return code
    except typer.Abort:
        return 130
    return result if isinstance(result, int) else 0


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point."""
    sys.exit(run_app(controller_app, argv))


if __name__ == "__main__":
    # Run as a script this file is `__main__`; the verbs in other modules register on the
    # importable module's app, so run that one.
    from tidal.controller.cli import main as _main

    _main()
