"""What the CLI's verbs share: the typer app they register on, the options that say how to
reach a server (``--url``, ``--token``, ``--data-dir``, ``--json``), and one way to print
results and fail.

Bad input is one line on stderr naming the argument, with exit status 2; a refusal by the
server exits 1 (:func:`call`). Importing this module stays light (``tidal --help``): the
SDK, pydantic and the server load inside the verbs.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console

# typer ships its own copy of click; its exceptions are the ones raised here.
from typer._click.exceptions import MissingParameter

if TYPE_CHECKING:
    from tidal.client import Client
    from tidal.wire.schema import JobView

__all__ = [
    "ClientOptions",
    "DataDirOpt",
    "JobArg",
    "call",
    "controller_app",
    "emit_json",
    "err",
    "fail",
    "out",
    "pairs",
    "parse_duration",
    "with_client_options",
    "workers_count",
]

controller_app = typer.Typer(
    help="Share a pool of GPUs among elastic PyTorch training jobs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: Where results go, for people; errors go to :data:`err`.
out = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)

# -- shared options ------------------------------------------------------------------------

DataDirOpt = Annotated[
    Path | None,
    typer.Option("--data-dir", help="Server data dir.", show_default="$TIDAL_DATA_DIR or ~/.tidal"),
]
UrlOpt = Annotated[
    str | None, typer.Option("--url", envvar="TIDAL_URL", help="Server URL (else from data dir).")
]
TokenOpt = Annotated[
    str | None, typer.Option("--token", envvar="TIDAL_TOKEN", help="Token (else from data dir).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON output.")]
JobArg = Annotated[str, typer.Argument(help="Job id (or name: the latest job with it).")]


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``tidal: message`` on stderr and exit with ``code``."""
    err.print(f"tidal: {message}", markup=False)
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
            return Client(url=self.url, token=self.token, data_dir=self.data_dir, via="cli")
        except ClientError as exc:
            fail(str(exc))

    def show_data(self, data: Any, message: str) -> None:
        """Print a result: ``message`` for people, ``data`` as JSON with ``--json``."""
        if self.as_json:
            emit_json(data)
        else:
            out.print(message, markup=False)

    def show(self, view: JobView, message: str) -> None:
        """Print a changed job: ``message`` for people, the job as JSON with ``--json``."""
        if self.as_json:
            emit_json(view)
        else:
            out.print(message, markup=False)


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


def call(action: Callable[[], Any], arg: str | None = None) -> Any:
    """Run one SDK call, turning its errors into one-line messages and exit codes."""
    from tidal.client import ClientError, InvalidRequest, NotFound

    try:
        return action()
    except InvalidRequest as exc:
        where = f"{arg}: " if arg else ""
        fail(f"{where}{exc}", 2)
    except NotFound as exc:
        fail(str(exc))
    except ClientError as exc:
        fail(str(exc))


def emit_json(data: Any) -> None:
    """Write ``data`` (a pydantic model, a list of them, or plain JSON data) to stdout."""
    from pydantic import BaseModel

    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    elif isinstance(data, list):
        data = [d.model_dump(mode="json") if isinstance(d, BaseModel) else d for d in data]
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def pairs(values: Sequence[str] | None, option: str) -> dict[str, str]:
    """``KEY=VALUE`` arguments of ``option`` as a dict; a bad one is a usage error."""
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected KEY=VALUE (got {item!r})", param_hint=option)
        out[key] = value
    return out


def workers_count(n: int | None, workers: int | None) -> tuple[int, str]:
    """The size a resize verb asks for, given as its argument ``N`` (as the docs write
    ``tidal scale JOB 4``) or as ``--workers N`` (as scripts do), or both if they agree;
    with the name of the one given, for messages. A usage error naming ``--workers`` if
    they differ, or both if neither is given."""
    if workers is None:
        if n is None:
            raise MissingParameter(param_hint="N (or --workers N)", param_type="argument")
        return n, "N"
    if n is not None and n != workers:
        raise typer.BadParameter(
            f"N is {n} but --workers is {workers}: give one of them", param_hint="--workers"
        )
    return workers, "--workers"


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
