"""``tidal dataset register | list | describe | delete``: the registry's datasets on the
command line (a name for a folder of files or a URL, with versions; its models:
:mod:`tidal.cli.registry`).

Importing this module stays light (``tidal --help``): the SDK and the registry's bodies
load inside the verbs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tidal.cli.options import ClientOptions, call, emit_json, out, with_client_options
from tidal.cli.table_style import plain_table

if TYPE_CHECKING:
    from tidal.wire.registry import DatasetView

__all__ = ["dataset_app"]

dataset_app = typer.Typer(
    help="Register datasets (a name for a folder of files, or a URL), with versions.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

NameArg = Annotated[str, typer.Argument(help="The dataset's name.")]


def _location(text: str) -> str:
    """A URL as given; a path made absolute (the server reads it on its host)."""
    from tidal.wire.registry import is_url

    return text if is_url(text) else str(Path(text).expanduser().resolve())


def _size(size: int | None) -> str:
    if size is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


@dataset_app.command("register")
@with_client_options()
def register_dataset(
    options: ClientOptions,
    name: NameArg,
    location: Annotated[
        str, typer.Argument(help="A folder or file on the server's host, or a URL.")
    ],
    format: Annotated[str, typer.Option("--format", help="e.g. csv, images, parquet.")] = "",
    description: Annotated[str, typer.Option(help="What it holds.")] = "",
) -> None:
    """Register a dataset, or its next version if the name is taken."""
    client = options.client()
    version = call(
        lambda: client.register_dataset(
            name, _location(location), format=format, description=description
        ),
        "",
    )
    if options.as_json:
        emit_json(version)
        return
    out.print(
        f"registered dataset [bold]{version.dataset}[/] version {version.version} "
        f"({_size(version.size)})"
    )


@dataset_app.command("list")
@with_client_options()
def list_datasets(options: ClientOptions) -> None:
    """List datasets with their latest version."""
    client = options.client()
    datasets: list[DatasetView] = call(client.datasets)
    if options.as_json:
        emit_json(datasets)
        return
    if not datasets:
        out.print("no datasets")
        return
    table = plain_table(
        "NAME", "VERSIONS", "LATEST", "SIZE", "LOCATION", width=min(out.width, 80), fold=True
    )
    for d in datasets:
        latest = d.versions[-1] if d.versions else None
        table.add_row(
            d.name,
            str(len(d.versions)),
            str(latest.version) if latest else "-",
            _size(latest.size) if latest else "-",
            latest.location if latest else "-",
        )
    out.print(table)


@dataset_app.command("describe")
@with_client_options()
def describe_dataset(options: ClientOptions, name: NameArg) -> None:
    """Show a dataset's versions and the model versions trained on each."""
    client = options.client()
    dataset: DatasetView = call(lambda: client.dataset(name))
    if options.as_json:
        emit_json(dataset)
        return
    out.print(f"[bold]{dataset.name}[/]  owner {dataset.owner}", highlight=False)
    if dataset.description:
        out.print(dataset.description, markup=False)
    table = plain_table(
        "VERSION", "SIZE", "CHECKSUM", "LOCATION", "USED BY", width=min(out.width, 80), fold=True
    )
    for v in dataset.versions:
        table.add_row(
            str(v.version),
            _size(v.size),
            (v.checksum or "-")[:12],
            v.location,
            ", ".join(v.used_by) or "-",
        )
    out.print(table)


@dataset_app.command("delete")
@with_client_options(json_output=False)
def delete_dataset(
    options: ClientOptions,
    ref: Annotated[str, typer.Argument(metavar="NAME[:VERSION]", help="A dataset or one version.")],
) -> None:
    """Delete a dataset version, or the whole dataset; refused while a model version
    was trained on it."""
    from tidal.wire.registry import parse_dataset_ref

    try:
        name, version = parse_dataset_ref(ref)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="NAME[:VERSION]") from None
    client = options.client()
    call(lambda: client.delete_dataset(name, version))
    out.print(f"deleted dataset {ref}", markup=False)
