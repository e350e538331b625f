"""``POST /models/{name}/train``: a job running a model's entry point with checked
parameters, submitted through the normal path.

Everything is checked before anything is stored: each parameter against the model's
type and range, the dataset (``NAME`` or ``NAME:VERSION``, the model's own by default),
the workers range, and (where the workers see the server's files) the code folder and
entry point. Each problem names its field (``params.lr``, ``dataset``, ``workers``,
``entry_point``). The job's workers get the parameters as JSON in ``TIDAL_PARAMS`` and
the dataset version's location in ``TIDAL_DATASET``; its checkpoints go under the
server's data dir, ``models/<model>/<run>``, which its model version then points at.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from tidal.controller.routes.auth import PrincipalDep
from tidal.controller.routes.deps import JobStoreDep
from tidal.controller.routes.errors import ErrorBody, ProtectedRoute
from tidal.controller.routes.registry import NameArg, refused
from tidal.controller.routes.spec_body import check_runnable
from tidal.controller.routes.views import job_view
from tidal.controller.store.registry import DatasetChoice, ModelRun, UnknownEntry
from tidal.controller.support import capabilities_of
from tidal.spec import JobSpec, SpecError, parse_spec
from tidal.spec_fields import parse_workers_range
from tidal.wire.registry import (
    ENV_DATASET,
    ENV_PARAMS,
    MODEL_LABEL,
    ModelView,
    ParamError,
    ParamValue,
    TrainRequest,
    check_params,
    parse_dataset_ref,
)
from tidal.wire.schema import Submitted

__all__ = ["router", "training_spec"]

router = APIRouter(tags=["registry"], route_class=ProtectedRoute)

#: The label naming the dataset version a job trains on (``NAME:VERSION``).
DATASET_LABEL = "tidal.dataset"
#: A spec field of the training job → the training request's (or model's) field.
_FIELDS = {"command": "entry_point", "working_dir": "code", "workers": "workers"}


def training_spec(
    model: ModelView,
    params: dict[str, ParamValue],
    dataset: DatasetChoice | None,
    workers: str | int,
    checkpoint_dir: str,
    priority: int | None = None,
) -> dict[str, Any]:
    """The job spec (plain data) that trains ``model``: pure."""
    env = {ENV_PARAMS: json.dumps(params, sort_keys=True)}
    labels = {MODEL_LABEL: model.name}
    if dataset is not None:
        env[ENV_DATASET] = dataset.location
        labels[DATASET_LABEL] = f"{dataset.dataset}:{dataset.version}"
    spec: dict[str, Any] = {
        "name": model.name,
        "command": ["python", model.entry_point],
        "working_dir": model.code,
        "env": env,
        "workers": workers,
        "labels": labels,
        "checkpoint_dir": checkpoint_dir,
    }
    if priority is not None:
        spec["priority"] = priority
    return spec


def _request_field(path: str) -> str:
    """A training job's spec field as the training request names it."""
    head = path.split(".")[0]
    return _FIELDS.get(head, path)


@router.post(
    "/models/{name}/train",
    status_code=status.HTTP_201_CREATED,
    response_model=Submitted,
    responses={404: {"model": ErrorBody, "description": "No model of that name."}},
)
async def train(
    name: NameArg, body: TrainRequest, request: Request, store: JobStoreDep, who: PrincipalDep
) -> Response:
    """Train a model: a job running its entry point with these parameters (the model's
    defaults for the others), on its dataset or the one named. 422 naming each field
    at fault, with nothing stored."""
    model = await run_in_threadpool(store.model, name)
    if model is None:
        raise HTTPException(status_code=status.HTTP_404_NOT_FOUND, detail=f"no model {name!r}")
    problems: list[tuple[str, str]] = []
    params: dict[str, ParamValue] = {}
    try:
        params = check_params(model.params, body.params)
    except ParamError as exc:
        problems += exc.problems
    dataset = None
    ref = body.dataset or model.dataset
    if ref is not None:
        try:
            dataset_name, version = parse_dataset_ref(ref)
            dataset = await run_in_threadpool(store.choose_dataset, dataset_name, version)
        except ValueError as exc:
            problems.append(("dataset", str(exc)))
        except UnknownEntry as exc:
            problems.append(("dataset", str(exc)))
    try:
        parse_workers_range(body.workers)
    except ValueError as exc:
        problems.append(("workers", str(exc)))
    if problems:
        raise refused(problems)
    controller = request.app.state.controller
    run_dir = Path(controller.files.data_dir) / "models" / name / secrets.token_hex(4)
    data = training_spec(model, params, dataset, body.workers, str(run_dir), body.priority)
    try:
        spec: JobSpec = parse_spec(data)
        check_runnable(spec, capabilities_of(controller.backend), controller.cluster)
    except SpecError as exc:
        raise refused([(_request_field(p), m) for p, m in exc.problems]) from None
    run = ModelRun(name, dict(params), dataset.id if dataset else None, str(run_dir))
    job = await run_in_threadpool(
        lambda: store.add_job(spec, owner=who.user, team=who.team, source=who.source, run=run)
    )
    view = Submitted.model_construct(**dict(job_view(job)), warnings=[])
    return Response(
        status_code=status.HTTP_201_CREATED,
        content=view.model_dump_json(),
        media_type="application/json",
    )
