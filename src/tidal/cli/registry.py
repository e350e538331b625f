"""``tidal model register | list | describe | versions | alias`` and ``tidal train``: the
registry's models on the command line (its datasets: :mod:`tidal.cli.datasets`).

Importing this module stays light (``tidal --help``): the SDK and the registry's bodies
load inside the verbs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tidal.cli.options import (
    ClientOptions,
    call,
    controller_app,
    emit_json,
    out,
    pairs,
    with_client_options,
)
from tidal.cli.table_style import plain_table

if TYPE_CHECKING:
    from tidal.wire.registry import ModelVersionView, ModelView, ParamSpec
    from tidal.wire.schema import Submitted

__all__ = ["model_app", "train"]

model_app = typer.Typer(
    help="Register models (code, entry point, parameters), their versions and aliases.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

NameArg = Annotated[str, typer.Argument(help="The model's name.")]


# -- models ---------------------------------------------------------------------------------


@model_app.command("register")
@with_client_options()
def register_model(
    options: ClientOptions,
    name: NameArg,
    entry: Annotated[str, typer.Option("--entry", help="The script to run, in the code folder.")],
    code: Annotated[Path, typer.Option(help="The folder of the model's code.")] = Path(),
    framework: Annotated[str, typer.Option(help="pytorch, tensorflow, ...")] = "pytorch",
    dataset: Annotated[str | None, typer.Option(help="The dataset it trains on.")] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME:TYPE=DEFAULT, then [MIN,MAX] or {A,B}; e.g. epochs:int=10[1,100], "
            "opt:str=sgd{sgd,adam}. Repeatable."
        ),
    ] = None,
    tag: Annotated[list[str] | None, typer.Option(help="KEY=VALUE, repeatable.")] = None,
    description: Annotated[str, typer.Option(help="What it is.")] = "",
) -> None:
    """Register a model: its code, entry point, typed parameters and dataset."""
    from pydantic import ValidationError

    from tidal.wire.registry import ModelIn, parse_param_flag

    params = []
    for text in param or []:
        try:
            params.append(parse_param_flag(text))
        except (ValueError, ValidationError) as exc:
            raise typer.BadParameter(_first_error(exc), param_hint="--param") from None
    tags = pairs(tag, "--tag")
    try:
        body = ModelIn(
            name=name,
            framework=framework,
            code=str(code.expanduser().resolve()),
            entry_point=entry,
            params=params,
            dataset=dataset,
            description=description,
            tags=tags,
        )
    except ValidationError as exc:
        raise typer.BadParameter(_first_error(exc), param_hint="NAME") from None
    client = options.client()
    model = call(lambda: client.register_model(body), "")
    if options.as_json:
        emit_json(model)
        return
    out.print(f"registered model [bold]{model.name}[/] ({len(model.params)} parameters)")


def _first_error(exc: Exception) -> str:
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        return f"{where}: {message}" if where else message
    return str(exc)


@model_app.command("list")
@with_client_options()
def list_models(options: ClientOptions) -> None:
    """List models."""
    client = options.client()
    models: list[ModelView] = call(client.models)
    if options.as_json:
        emit_json(models)
        return
    if not models:
        out.print("no models")
        return
    table = plain_table(
        "NAME", "FRAMEWORK", "DATASET", "LATEST", "ALIASES", width=min(out.width, 80), fold=True
    )
    for m in models:
        table.add_row(
            m.name,
            m.framework,
            m.dataset or "-",
            str(m.latest_version or "-"),
            ", ".join(f"{a}→{v}" for a, v in m.aliases.items()) or "-",
        )
    out.print(table)


def _param_range(p: ParamSpec) -> str:
    if p.choices is not None:
        return "{" + ",".join(p.choices) + "}"
    if p.min is None and p.max is None:
        return "-"
    low = "" if p.min is None else f"{p.min:g}"
    high = "" if p.max is None else f"{p.max:g}"
    return f"[{low}, {high}]"


@model_app.command("describe")
@with_client_options()
def describe_model(options: ClientOptions, name: NameArg) -> None:
    """Show a model: where its code is, its parameters, aliases and tags."""
    client = options.client()
    model: ModelView = call(lambda: client.model(name))
    if options.as_json:
        emit_json(model)
        return
    lines = [
        f"[bold]{model.name}[/]  {model.framework}  owner {model.owner}",
        f"code      {model.code}",
        f"entry     {model.entry_point}",
        f"dataset   {model.dataset or '-'}",
        f"latest    {model.latest_version or '-'}",
    ]
    if model.aliases:
        lines.append("aliases   " + ", ".join(f"{a}→{v}" for a, v in model.aliases.items()))
    if model.tags:
        lines.append("tags      " + ", ".join(f"{k}={v}" for k, v in model.tags.items()))
    for line in lines:
        out.print(line, highlight=False)
    if model.params:
        table = plain_table(
            "PARAMETER", "TYPE", "DEFAULT", "RANGE", "HELP", width=min(out.width, 80), fold=True
        )
        for p in model.params:
            table.add_row(p.name, p.type, str(p.default), _param_range(p), p.help or "")
        out.print(table)


@model_app.command("versions")
@with_client_options()
def model_versions(options: ClientOptions, name: NameArg) -> None:
    """List a model's versions: the job, dataset version, metrics of each."""
    client = options.client()
    versions: list[ModelVersionView] = call(lambda: client.model_versions(name))
    if options.as_json:
        emit_json(versions)
        return
    if not versions:
        out.print(f"model {name} has no versions yet: `tidal train {name}` makes one")
        return
    table = plain_table(
        "VERSION", "JOB", "DATASET", "METRICS", "ALIASES", width=min(out.width, 80), fold=True
    )
    for v in versions:
        metrics = ", ".join(f"{k}={value:.4g}" for k, value in sorted(v.metrics.items()))
        table.add_row(
            str(v.version),
            v.job_id or "-",
            v.dataset or "-",
            metrics or "-",
            ", ".join(v.aliases) or "-",
        )
    out.print(table)


@model_app.command("alias")
@with_client_options()
def alias(
    options: ClientOptions,
    name: NameArg,
    alias_name: Annotated[str, typer.Argument(metavar="ALIAS", help="e.g. champion.")],
    version: Annotated[int, typer.Argument(help="The version it points at.", min=1)],
) -> None:
    """Point an alias of a model at one of its versions."""
    client = options.client()
    model = call(lambda: client.set_alias(name, alias_name, version), "VERSION")
    if options.as_json:
        emit_json(model)
        return
    out.print(f"{name}@{alias_name} → version {version}", markup=False)


# -- training -------------------------------------------------------------------------------


@controller_app.command()
@with_client_options()
def train(
    options: ClientOptions,
    model: Annotated[str, typer.Argument(help="The registered model to train.")],
    dataset: Annotated[
        str | None, typer.Option(help="NAME or NAME:VERSION.", show_default="the model's, latest")
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="A parameter, NAME=VALUE (repeatable)."),
    ] = None,
    workers: Annotated[str, typer.Option(help="N or MIN:MAX.")] = "1",
    priority: Annotated[int | None, typer.Option(help="Higher is more important.", min=1)] = None,
) -> None:
    """Train a model: submit a job running its entry point with these parameters."""
    from tidal.client import InvalidRequest

    params = pairs(set_, "--set")
    client = options.client()

    def submit() -> Submitted:
        try:
            return client.train(
                model, dataset=dataset, params=params, workers=workers, priority=priority
            )
        except InvalidRequest as exc:
            # Name the flag each field came from: --set NAME, --dataset, --workers.
            raise InvalidRequest([(_flag(field), msg) for field, msg in exc.problems]) from None

    job: Submitted = call(submit, "")
    if options.as_json:
        emit_json(job)
        return
    out.print(f"submitted [bold]{job.id}[/] ({job.state}) training model {model}")


def _flag(field: str) -> str:
    if field.startswith("params."):
        return f"--set {field.removeprefix('params.')}"
    if field in ("dataset", "workers", "priority"):
        return f"--{field}"
    return field
