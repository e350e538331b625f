"""The registry: datasets and their versions, models, their versions and aliases.

Registering a dataset version measures a local path's size and checksum; registering a
model checks, where the workers see the server's files, that its code folder and entry
point are there. Deleting a dataset version a model version was trained on is refused
(409, naming the version). Training a model is :mod:`~tidal.controller.routes.training`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response, status

from tidal.controller.dataset_files import measure
from tidal.controller.routes.deps import UNPROCESSABLE, JobStoreDep
from tidal.controller.routes.errors import ErrorBody, ProtectedRoute
from tidal.controller.store.registry import RegistryConflict, UnknownEntry
from tidal.controller.support import capabilities_of
from tidal.wire.registry import (
    DatasetIn,
    DatasetVersionView,
    DatasetView,
    ModelAlias,
    ModelIn,
    ModelVersionView,
    ModelView,
)

__all__ = ["model_files_problems", "refused", "router"]

router = APIRouter(tags=["registry"], route_class=ProtectedRoute)

#: A path's registry name (a dataset's or model's).
NameArg = Annotated[str, Path(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$")]
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No dataset or model of that name."}
}
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorBody, "description": "The registry's state refuses it."}
}


def refused(problems: Sequence[tuple[str, str]]) -> HTTPException:
    """A 422 listing each ``(field, message)``, shaped like FastAPI's own."""
    return HTTPException(
        status_code=UNPROCESSABLE,
        detail=[
            {"loc": ["body", *field.split(".")], "path": field, "msg": msg, "type": "value_error"}
            for field, msg in problems
        ],
    )


def _not_found(message: str) -> HTTPException:
    return HTTPException(status_code=status.HTTP_404_NOT_FOUND, detail=message)


def _conflict(exc: Exception) -> HTTPException:
    return HTTPException(status_code=status.HTTP_409_CONFLICT, detail=str(exc))


def model_files_problems(code: str, entry_point: str) -> list[tuple[str, str]]:
    """Whether a model's code folder and entry point are on this host, as problems."""
    if not os.path.isabs(code):
        return [("code", f"expected an absolute path, got {code!r}")]
    if not os.path.isdir(code):
        return [("code", f"no such directory on the server's host: {code}")]
    script = os.path.join(code, entry_point)
    if not os.path.isfile(script):
        return [("entry_point", f"no such file on the server's host: {script}")]
    return []


# -- datasets -------------------------------------------------------------------------------


@router.post("/datasets", status_code=status.HTTP_201_CREATED, response_model=DatasetVersionView)
def register_dataset(body: DatasetIn, store: JobStoreDep) -> DatasetVersionView:
    """Register a dataset version: a new dataset, or its next version. A local path's
    size and checksum are measured now."""
    try:
        measured = measure(body.location)
    except ValueError as exc:
        raise refused([("location", str(exc))]) from None
    return store.add_dataset_version(body, measured.size, measured.checksum)


@router.get("/datasets", response_model=list[DatasetView])
def list_datasets(store: JobStoreDep) -> list[DatasetView]:
    """Every dataset with its versions."""
    return store.datasets()


@router.get("/datasets/{name}", response_model=DatasetView, responses=_NOT_FOUND)
def get_dataset(name: NameArg, store: JobStoreDep) -> DatasetView:
    """A dataset, its versions, and the model versions trained on each."""
    found = store.dataset(name)
    if found is None:
        raise _not_found(f"no dataset {name!r}")
    return found


@router.delete(
    "/datasets/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses={**_NOT_FOUND, **_CONFLICT},
)
def delete_dataset(
    name: NameArg,
    store: JobStoreDep,
    version: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
) -> Response:
    """Delete one version (``version``) or the whole dataset; 409 naming what uses it."""
    try:
        store.delete_dataset(name, version)
    except UnknownEntry as exc:
        raise _not_found(str(exc)) from None
    except RegistryConflict as exc:
        raise _conflict(exc) from None
    return Response(status_code=status.HTTP_204_NO_CONTENT)


# -- models ---------------------------------------------------------------------------------


@router.post(
    "/models", status_code=status.HTTP_201_CREATED, response_model=ModelView, responses=_CONFLICT
)
def register_model(body: ModelIn, request: Request, store: JobStoreDep) -> ModelView:
    """Register a model: its code, entry point, parameters and dataset. 409 if the name
    is taken; 422 naming ``dataset`` if it is not registered, ``code`` or
    ``entry_point`` if the workers would not find them."""
    problems: list[tuple[str, str]] = []
    if capabilities_of(request.app.state.controller.backend).shared_files:
        problems += model_files_problems(body.code, body.entry_point)
    if body.dataset is not None and store.dataset(body.dataset) is None:
        problems.append(("dataset", f"no dataset {body.dataset!r} is registered"))
    if problems:
        raise refused(problems)
    try:
        return store.add_model(body)
    except RegistryConflict as exc:
        raise _conflict(exc) from None
    except UnknownEntry as exc:  # deleted meanwhile
        raise refused([(exc.field, str(exc))]) from None


@router.get("/models", response_model=list[ModelView])
def list_models(store: JobStoreDep) -> list[ModelView]:
    """Every registered model."""
    return store.models()


@router.get("/models/{name}", response_model=ModelView, responses=_NOT_FOUND)
def get_model(name: NameArg, store: JobStoreDep) -> ModelView:
    """A model: its definition, aliases and latest version."""
    found = store.model(name)
    if found is None:
        raise _not_found(f"no model {name!r}")
    return found


@router.get("/models/{name}/versions", response_model=list[ModelVersionView], responses=_NOT_FOUND)
def model_versions(name: NameArg, store: JobStoreDep) -> list[ModelVersionView]:
    """A model's versions with their lineage: the job, checkpoint, metrics, parameters
    and dataset version of each."""
    try:
        return store.model_versions(name)
    except UnknownEntry as exc:
        raise _not_found(str(exc)) from None


@router.put("/models/{name}/aliases/{alias}", response_model=ModelView, responses=_NOT_FOUND)
def set_alias(name: NameArg, alias: NameArg, body: ModelAlias, store: JobStoreDep) -> ModelView:
    """Point ``alias`` at one of the model's versions (422 naming ``version`` if it has
    no such version)."""
    try:
        return store.set_alias(name, alias, body.version)
    except UnknownEntry as exc:
        if exc.field == "version":
            raise refused([("version", str(exc))]) from None
        raise _not_found(str(exc)) from None
