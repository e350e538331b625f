"""``tidal submit`` and ``tidal export``: jobs in and out, in tidal's form or Kubeflow's.

``tidal submit FILE`` takes a tidal spec or a Kubeflow manifest (TFJob, PyTorchJob,
TrainJob: :mod:`tidal.compat`), printing each field of a manifest tidal cannot honour as a
warning; ``tidal submit --name NAME [flags] -- COMMAND`` builds the spec from flags,
Arena's among them (``--workers 3 --min-workers 1 --max-workers 9 --gpus 1``).
``tidal export JOB --as tfjob|pytorchjob|trainjob`` writes a job back as a manifest.
Importing this module stays light: the SDK, pydantic and yaml load inside the verbs.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from tidal.cli.options import (
    ClientOptions,
    JobArg,
    call,
    controller_app,
    emit_json,
    err,
    fail,
    out,
    pairs,
    with_client_options,
)

__all__ = ["export", "submit", "workers_from_flags"]


def _warn(warnings: Sequence[tuple[str, str]]) -> None:
    for path, message in warnings:
        line = Text("warning: ", style="yellow")
        line.append(f"{path}: {message}" if path else message)
        err.print(line)


def workers_from_flags(
    workers: str | None, least: int | None, most: int | None
) -> str | dict[str, int] | None:
    """The spec's ``workers`` from ``--workers`` (``N`` or ``MIN:MAX``) and Arena's
    ``--min-workers`` / ``--max-workers`` (``--workers`` is then the job's target, its
    ``initial``: the policy holds it there until ``tidal scale`` sets another).

    Raises ``typer.BadParameter`` naming the flag at fault.
    """
    from tidal.spec import parse_workers_range

    if workers is not None:
        try:
            parse_workers_range(workers)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--workers") from None
    if least is None and most is None:
        return workers
    start: int | None = None
    if workers is not None:
        if not workers.strip().isdigit():
            raise typer.BadParameter(
                f"with --min-workers/--max-workers, give the target size (got {workers!r})",
                param_hint="--workers",
            )
        start = int(workers)
    low = least if least is not None else (start if start is not None else 1)
    high = most if most is not None else (start if start is not None else low)
    if low > high:
        raise typer.BadParameter(
            f"must be ≤ --max-workers (got {low} > {high})", param_hint="--min-workers"
        )
    if start is not None and not low <= start <= high:
        raise typer.BadParameter(
            f"must be within --min-workers and --max-workers ({low}-{high}; got {start})",
            param_hint="--workers",
        )
    out = {"min": low, "max": high}
    if start is not None:
        out["initial"] = start
    return out


@controller_app.command(
    epilog=(
        "Examples: tidal submit job.yaml; tidal submit tfjob.yaml (a Kubeflow manifest); "
        "tidal submit --name x --workers 3 --min-workers 1 --max-workers 9 -- python t.py"
    )
)
@with_client_options()
def submit(
    options: ClientOptions,
    args: Annotated[
        list[str] | None,
        typer.Argument(
            help="A spec or Kubeflow manifest (YAML), or with --name the command to run.",
            show_default=False,
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Job name (spec from the options).")] = None,
    workers: Annotated[
        str | None,
        typer.Option(help="N or MIN:MAX; with --min/--max-workers, N is the target size."),
    ] = None,
    min_workers: Annotated[int | None, typer.Option(min=1, help="Fewest workers (Arena).")] = None,
    max_workers: Annotated[int | None, typer.Option(min=1, help="Most workers (Arena).")] = None,
    gpus: Annotated[int | None, typer.Option(min=0, help="GPUs per worker.")] = None,
    priority: Annotated[int | None, typer.Option(help="Higher is more important.")] = None,
    label: Annotated[list[str] | None, typer.Option(help="KEY=VALUE, repeatable.")] = None,
    env: Annotated[list[str] | None, typer.Option(help="KEY=VALUE, repeatable.")] = None,
    group: Annotated[str | None, typer.Option(help="Target resource group.")] = None,
    team: Annotated[str | None, typer.Option(help="Team whose queue the job waits in.")] = None,
    max_restarts: Annotated[int | None, typer.Option(min=0)] = None,
    working_dir: Annotated[str | None, typer.Option()] = None,
    checkpoint_dir: Annotated[str | None, typer.Option()] = None,
    launcher: Annotated[
        str | None, typer.Option(help="tidal, or torchrun (restart-based resize).")
    ] = None,
    runtime: Annotated[
        list[str] | None,
        typer.Option(help="A Kubeflow training runtime file a TrainJob names; repeatable."),
    ] = None,
) -> None:
    """Submit a job from a spec file or Kubeflow manifest, or from options and a command."""
    from tidal.compat import load_file
    from tidal.spec import SpecError, parse_spec

    args = args or []
    size = workers_from_flags(workers, min_workers, max_workers)
    try:
        if name is None:
            if len(args) != 1:
                raise typer.BadParameter(
                    "give one spec file, or --name and the command after --", param_hint="ARGS"
                )
            spec, warnings = load_file(args[0], runtime or ())
            _warn(warnings)
            base = spec.model_dump(mode="json", exclude_defaults=True)
        else:
            if runtime:
                raise typer.BadParameter(
                    "a runtime goes with a TrainJob file", param_hint="--runtime"
                )
            if not args:
                raise typer.BadParameter("give the command to run after --", param_hint="ARGS")
            base = {"name": name, "command": list(args)}
        if "roles" in base and (size is not None or gpus is not None):
            flag = "--gpus" if size is None else "--workers"
            raise typer.BadParameter(
                "this job lists its roles: set roles[i].replicas and resources in its file",
                param_hint=flag,
            )
        overrides: dict[str, Any] = {
            "workers": size,
            "priority": priority,
            "working_dir": working_dir,
            "checkpoint_dir": checkpoint_dir,
            "launcher": launcher,
            "team": team,
        }
        data = {**base, **{k: v for k, v in overrides.items() if v is not None}}
        if gpus is not None:
            data["resources"] = {**data.get("resources", {}), "gpus": gpus}
        if label:
            data["labels"] = {**data.get("labels", {}), **pairs(label, "--label")}
        if env:
            data["env"] = {**data.get("env", {}), **pairs(env, "--env")}
        if group is not None:
            data["target"] = {**data.get("target", {}), "group": group}
        if max_restarts is not None:
            data["restart"] = {"max_restarts": max_restarts}
        # The server runs elsewhere (another cwd): pin the directory the user means now.
        # A relative working_dir in a spec file is relative to that file.
        anchor = Path(args[0]).resolve().parent if name is None else Path.cwd()
        given = data.get("working_dir")
        data["working_dir"] = str((anchor / given).resolve()) if given else str(Path.cwd())
        for role in data.get("roles") or ():
            if isinstance(role, dict) and isinstance(role.get("working_dir"), str):
                role["working_dir"] = str((anchor / role["working_dir"]).resolve())
        spec = parse_spec(data, source=args[0] if name is None else None)
    except SpecError as exc:
        from tidal.cli.flags import flag_problems

        flags = {
            "--name": name, "--workers": workers, "--min-workers": min_workers,
            "--max-workers": max_workers, "--gpus": gpus, "--priority": priority,
            "--label": label, "--env": env, "--group": group, "--max-restarts": max_restarts,
            "--working-dir": working_dir, "--checkpoint-dir": checkpoint_dir,
            "--launcher": launcher, "--team": team, "ARGS": args if name is not None else None,
        }  # fmt: skip
        given = {flag for flag, value in flags.items() if value is not None}
        fail(SpecError(flag_problems(exc.problems, given), exc.source).summary(), 2)
    client = options.client()
    job = call(lambda: client.submit(spec), "spec")
    _warn([(w.path, w.msg) for w in getattr(job, "warnings", ())])  # older servers send none
    if options.as_json:
        emit_json(job)
    else:
        out.print(f"submitted [bold]{job.id}[/] ({job.state})")


@controller_app.command("export")
@with_client_options(json_output=False)
def export(
    options: ClientOptions,
    job: JobArg,
    kind: Annotated[
        str, typer.Option("--as", help="tfjob, pytorchjob or trainjob.", show_default=False)
    ],
    image: Annotated[
        str | None,
        typer.Option(help="Container image the pods run (required: Kubernetes needs one)."),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="File to write.", show_default="stdout")
    ] = None,
) -> None:
    """Write a job back as a Kubeflow manifest (TFJob, PyTorchJob or TrainJob)."""
    import yaml

    from tidal.compat.export import EXPORT_KINDS, export_manifest
    from tidal.spec import JobSpec, SpecError

    if kind not in EXPORT_KINDS:
        raise typer.BadParameter(
            f"expected one of {', '.join(EXPORT_KINDS)} (got {kind!r})", param_hint="--as"
        )
    if image is None:
        # A pod without an image is refused by Kubernetes; tidal cannot know the one to use.
        raise typer.BadParameter(
            "Kubernetes needs the container image the job's code runs in "
            "(e.g. --image registry/train:1)",
            param_hint="--image",
        )
    client = options.client()
    detail = call(lambda: client.get(job))
    try:
        manifest, warnings = export_manifest(JobSpec.model_validate(detail.spec), kind, image)
    except SpecError as exc:
        fail(f"{detail.id}: {exc.summary()}", 2)
    _warn(warnings)
    text = yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True)
    if output is None:
        sys.stdout.write(text)
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            fail(f"cannot write {output}: {exc.strerror or exc}")
