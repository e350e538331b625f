"""The controller's CLI verbs: ``tidal server``, ``tidal submit``, ``tidal list`` and the rest.

Output is rich tables for people and ``--json`` for scripts. Bad input is one line on
stderr naming the argument, with exit status 2; a refusal by the server exits 1. The verbs
that talk to a server share ``--url``, ``--token``, ``--data-dir`` and ``--json`` through
:func:`with_client_options`. Importing this module stays light (``tidal --help``): the SDK,
pydantic and the server load inside the verbs.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console, Group
from rich.text import Text
from typer.exceptions import TyperException

from tidal.controller.cli_tables import cluster_table, jobs_table, print_job_detail

if TYPE_CHECKING:
    from tidal.client import Client
    from tidal.controller.schema import ClusterView, JobDetail, JobView

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


# `tidal server`, then `tidal submit` and `tidal export`, live in their own modules;
# importing them here registers them on controller_app in this place of the help's list
# (they use the shared options above, hence mid-module).
from tidal.controller import server_cli as _server_cli  # noqa: E402, F401
from tidal.controller import submit_cli as _submit_cli  # noqa: E402,F401


@controller_app.command("list")
@with_client_options()
def list_jobs(
    options: ClientOptions,
    state: Annotated[list[str] | None, typer.Option(help="Filter by state, repeatable.")] = None,
    name: Annotated[str | None, typer.Option(help="Filter by name.")] = None,
    label: Annotated[list[str] | None, typer.Option(help="KEY=VALUE, repeatable.")] = None,
) -> None:
    """List jobs."""
    labels = _pairs(label, "--label")
    client = options.client()
    jobs = _call(
        lambda: client.list(state=state, name=name, labels=labels, full=options.as_json),
        "--state",
    )
    if options.as_json:
        _emit_json(jobs)
    elif not jobs:
        _out.print("no jobs")
    else:
        _out.print(jobs_table(jobs))


@controller_app.command()
@with_client_options()
def get(
    options: ClientOptions,
    job: JobArg,
) -> None:
    """Show one job: its state, workers and recent events."""
    client = options.client()
    detail: JobDetail = _call(lambda: client.get(job))
    events = _call(lambda: client.events(detail.id, limit=10))
    if options.as_json:
        data = detail.model_dump(mode="json")
        data["events"] = [e.model_dump(mode="json") for e in events]
        _emit_json(data)
        return
    print_job_detail(_out, detail, events)


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
        from tidal.controller.cli_roles import replica_worker

        detail: JobDetail = _call(lambda: client.get(job))
        try:
            worker = replica_worker(detail, role, index or 0)
        except ValueError as exc:
            flag, _, message = str(exc).partition(": ")
            raise typer.BadParameter(message, param_hint=flag) from None
    if not follow:
        sys.stdout.write(_call(lambda: client.logs(job, tail=tail, worker=worker)))
        return

    def stream() -> None:
        try:
            for line in client.follow_logs(job, tail=tail, worker=worker):
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
        except KeyboardInterrupt:
            pass

    _call(stream)


@controller_app.command()
@with_client_options()
def priority(
    options: ClientOptions,
    job: JobArg,
    value: Annotated[int, typer.Argument(metavar="N", help="New priority (higher wins).")],
) -> None:
    """Change a job's priority."""
    client = options.client()
    view = _call(lambda: client.priority(job, value), "N")
    options.show(view, f"{view.id}: priority {view.priority}")


@controller_app.command()
@with_client_options()
def scale(
    options: ClientOptions,
    job: JobArg,
    workers: Annotated[int, typer.Option(min=1, help="Exact number of workers.")],
) -> None:
    """Ask for exactly N workers (within the job's min and max)."""
    client = options.client()
    view = _call(lambda: client.scale(job, workers), "--workers")
    options.show(view, f"{view.id}: target {view.target_workers} worker(s)")


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
    view = _call(lambda: client.scale_out(job, count, seconds), "--count")
    options.show(view, f"{view.id}: target {view.target_workers} worker(s)")


@controller_app.command("scale-in")
@with_client_options()
def scale_in(
    options: ClientOptions,
    job: JobArg,
    count: Annotated[int, typer.Option(min=1, help="Workers to remove.")],
) -> None:
    """Shrink a running job by K workers."""
    client = options.client()
    view = _call(lambda: client.scale_in(job, count), "--count")
    options.show(view, f"{view.id}: target {view.target_workers} worker(s)")


@controller_app.command()
@with_client_options()
def cancel(
    options: ClientOptions,
    job: JobArg,
    wait: Annotated[bool, typer.Option(help="Wait until the job is cancelled.")] = False,
) -> None:
    """Cancel a job; its workers stop on the controller's next tick."""
    client = options.client()
    view = _call(lambda: client.cancel(job))
    if wait:
        view = _call(lambda: client.wait(view.id, timeout=60))
    options.show(view, f"{view.id}: {'cancelled' if wait else 'cancel requested'}")


@controller_app.command()
@with_client_options()
def cluster(
    options: ClientOptions,
) -> None:
    """Show hosts, slots and which jobs hold them."""
    client = options.client()
    view: ClusterView = _call(client.cluster)
    if options.as_json:
        _emit_json(view)
        return
    _out.print(f"policy {view.policy}: {view.used_slots}/{view.total_slots} slots used")
    _out.print(cluster_table(view))


@controller_app.command()
@with_client_options(json_output=False)
def top(
    options: ClientOptions,
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between refreshes.")] = 1.0,
    iterations: Annotated[int, typer.Option(min=0, hidden=True)] = 0,
) -> None:
    """A live view of the cluster and its jobs (Ctrl-C to leave)."""
    from rich.live import Live

    client = options.client()

    def frame() -> Group:
        view: ClusterView = _call(client.cluster)
        jobs = _call(lambda: client.list(state=["queued", "running", "rescaling"]))
        head = Text(
            f"tidal {client.url}  policy {view.policy}  "
            f"{view.used_slots}/{view.total_slots} slots used  {len(jobs)} active job(s)",
            style="bold",
        )
        return Group(head, cluster_table(view), Text(""), jobs_table(jobs))

    count = 0
    try:
        with Live(frame(), console=_out, auto_refresh=False) as live:
            while iterations == 0 or count < iterations:
                count += 1
                if iterations and count >= iterations:
                    break
                time.sleep(interval)
                live.update(frame(), refresh=True)
    except KeyboardInterrupt:
        pass


# `tidal workers launch | await | stop` (the SDK's worker verbs) live in their own module.
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
