"""The registry: datasets and their versions, models, their versions and aliases, and
the runs (jobs started from a model) whose output becomes a model version.

Every public method is one transaction (:class:`~tidal.controller.store.database.
Database`). A run's job is added by :meth:`~tidal.controller.store.jobs.JobStore.add_job`
with its :class:`ModelRun`, in the job's transaction; when the job succeeds,
:func:`record_output` registers its output in the transaction that marks it so.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tidal.controller.store.database import Database
from tidal.controller.store.registry_views import (
    dataset_version_view,
    dataset_view,
    model_view,
    version_views,
)
from tidal.controller.store.tables import (
    DatasetRow,
    DatasetVersionRow,
    JobRow,
    MetricRow,
    ModelAliasRow,
    ModelRow,
    ModelRunRow,
    ModelVersionRow,
)
from tidal.model import DEFAULT_OWNER
from tidal.model_states import ACTIVE_STATES
from tidal.wire.registry import (
    DatasetIn,
    DatasetVersionView,
    DatasetView,
    ModelIn,
    ModelVersionView,
    ModelView,
)

__all__ = [
    "ModelRegistry",
    "ModelRun",
    "RegistryConflict",
    "UnknownEntry",
    "insert_runs",
    "record_output",
    "refresh_output_metrics",
]


#: Attempts at registering a dataset version that raced another server's.
_RACES = 3


class UnknownEntry(LookupError):
    """No dataset, dataset version, model or model version of that name; ``field`` is
    the request's field that named it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class RegistryConflict(RuntimeError):
    """The registry's state refuses the change (a name taken, a version in use)."""


@dataclass(frozen=True)
class ModelRun:
    """What a job started from a model registers its output with."""

    model: str
    params: dict[str, Any] = field(default_factory=dict)
    dataset_version_id: int | None = None
    checkpoint: str | None = None


@dataclass(frozen=True)
class DatasetChoice:
    """A dataset version picked for a run: its row id and where it is."""

    id: int
    dataset: str
    version: int
    location: str


class ModelRegistry(Database):
    """The registry's reads and writes; a base of
    :class:`~tidal.controller.store.jobs.JobStore`."""

    # -- datasets ---------------------------------------------------------------------------

    def add_dataset_version(
        self,
        body: DatasetIn,
        size: int | None,
        checksum: str | None,
        now: float | None = None,
        owner: str = DEFAULT_OWNER,
    ) -> DatasetVersionView:
        """Register ``body`` as a new dataset (version 1) or its dataset's next version."""
        now = time.time() if now is None else now
        for attempt in range(_RACES):
            try:
                return self._add_dataset_version(body, size, checksum, now, owner)
            except IntegrityError:
                # Another server registered the same new name (or version number) first:
                # its row is there now, so the next attempt takes the version after it.
                if attempt == _RACES - 1:
                    raise
        raise AssertionError("unreachable")

    def _add_dataset_version(
        self, body: DatasetIn, size: int | None, checksum: str | None, now: float, owner: str
    ) -> DatasetVersionView:
        with self._transaction(write=True) as s:
            dataset = s.get(DatasetRow, body.name, with_for_update=True)
            if dataset is None:
                s.add(
                    DatasetRow(
                        name=body.name, owner=owner, description=body.description, created_at=now
                    )
                )
                s.flush()
            latest = s.scalar(
                select(func.max(DatasetVersionRow.version)).where(
                    DatasetVersionRow.dataset == body.name
                )
            )
            row = DatasetVersionRow(
                dataset=body.name,
                version=int(latest or 0) + 1,
                location=body.location,
                format=body.format,
                size=size,
                checksum=checksum,
                description=body.description,
                created_at=now,
            )
            s.add(row)
            s.flush()
            return dataset_version_view(row, [])

    def datasets(self) -> list[DatasetView]:
        """Every dataset, by name, with its versions."""
        with self._transaction() as s:
            names = list(s.scalars(select(DatasetRow.name).order_by(DatasetRow.name)))
            return [dataset_view(s, name) for name in names]

    def dataset(self, name: str) -> DatasetView | None:
        """The dataset ``name`` with its versions and what was trained on each."""
        with self._transaction() as s:
            if s.get(DatasetRow, name) is None:
                return None
            return dataset_view(s, name)

    def choose_dataset(
        self, name: str, version: int | None, field_name: str = "dataset"
    ) -> DatasetChoice:
        """A dataset's version (its latest when ``version`` is ``None``);
        :class:`UnknownEntry` naming ``field_name`` if there is none."""
        with self._transaction() as s:
            query = select(DatasetVersionRow).where(DatasetVersionRow.dataset == name)
            if version is not None:
                query = query.where(DatasetVersionRow.version == version)
            row = s.scalars(query.order_by(DatasetVersionRow.version.desc()).limit(1)).first()
            if row is None:
                what = f"{name}:{version}" if version is not None else name
                raise UnknownEntry(field_name, f"no dataset {what} is registered")
            return DatasetChoice(row.id, row.dataset, row.version, row.location)

    def delete_dataset(self, name: str, version: int | None = None) -> None:
        """Delete one version of a dataset, or (``version`` ``None``) the dataset and all
        its versions. :class:`RegistryConflict` naming what still uses it: a model
        version trained on it, a run of a model reading it, a model naming the dataset."""
        with self._transaction(write=True) as s:
            if s.get(DatasetRow, name, with_for_update=True) is None:
                raise UnknownEntry("dataset", f"no dataset {name!r}")
            query = select(DatasetVersionRow).where(DatasetVersionRow.dataset == name)
            if version is not None:
                query = query.where(DatasetVersionRow.version == version)
            rows = list(s.scalars(query))
            if version is not None and not rows:
                raise UnknownEntry("version", f"dataset {name} has no version {version}")
            ids = [r.id for r in rows]
            used = _users(s, ids)
            if used:
                raise RegistryConflict(f"dataset {name} is in use: {used}")
            if version is None:
                models = list(s.scalars(select(ModelRow.name).where(ModelRow.dataset == name)))
                if models:
                    raise RegistryConflict(
                        f"dataset {name} is in use: model {', '.join(models)} trains on it"
                    )
            # Runs that ended without a version keep their job, not the deleted version.
            s.execute(
                update(ModelRunRow)
                .where(ModelRunRow.dataset_version_id.in_(ids))
                .values(dataset_version_id=None)
            )
            s.execute(delete(DatasetVersionRow).where(DatasetVersionRow.id.in_(ids)))
            if version is None:
                s.execute(delete(DatasetRow).where(DatasetRow.name == name))

    # -- models -----------------------------------------------------------------------------

    def add_model(
        self, body: ModelIn, now: float | None = None, owner: str = DEFAULT_OWNER
    ) -> ModelView:
        """Register a model; :class:`RegistryConflict` if the name is taken,
        :class:`UnknownEntry` (``dataset``) if its dataset is not registered."""
        now = time.time() if now is None else now
        try:
            return self._add_model(body, now, owner)
        except IntegrityError:
            # Registered by another request between the check and the insert.
            raise RegistryConflict(f"model {body.name} is already registered") from None

    def _add_model(self, body: ModelIn, now: float, owner: str) -> ModelView:
        with self._transaction(write=True) as s:
            if s.get(ModelRow, body.name) is not None:
                raise RegistryConflict(f"model {body.name} is already registered")
            if body.dataset is not None and s.get(DatasetRow, body.dataset) is None:
                raise UnknownEntry("dataset", f"no dataset {body.dataset!r} is registered")
            row = ModelRow(
                name=body.name,
                framework=body.framework,
                code=body.code,
                entry_point=body.entry_point,
                params=[p.model_dump(mode="json") for p in body.params],
                dataset=body.dataset,
                owner=owner,
                description=body.description,
                tags=dict(body.tags),
                created_at=now,
            )
            s.add(row)
            s.flush()
            return model_view(s, row)

    def models(self) -> list[ModelView]:
        """Every model, by name."""
        with self._transaction() as s:
            return [model_view(s, r) for r in s.scalars(select(ModelRow).order_by(ModelRow.name))]

    def model(self, name: str) -> ModelView | None:
        """The model ``name``, if registered."""
        with self._transaction() as s:
            row = s.get(ModelRow, name)
            return model_view(s, row) if row is not None else None

    def model_versions(self, name: str) -> list[ModelVersionView]:
        """The model's versions, oldest first; :class:`UnknownEntry` if no such model."""
        with self._transaction() as s:
            if s.get(ModelRow, name) is None:
                raise UnknownEntry("model", f"no model {name!r}")
            rows = s.scalars(
                select(ModelVersionRow)
                .where(ModelVersionRow.model == name)
                .order_by(ModelVersionRow.version)
            )
            return version_views(s, list(rows))

    def set_alias(self, model: str, alias: str, version: int) -> ModelView:
        """Point ``alias`` of ``model`` at ``version`` (moving it if it pointed elsewhere)."""
        with self._transaction(write=True) as s:
            row = s.get(ModelRow, model)
            if row is None:
                raise UnknownEntry("model", f"no model {model!r}")
            exists = s.scalar(
                select(ModelVersionRow.id).where(
                    ModelVersionRow.model == model, ModelVersionRow.version == version
                )
            )
            if exists is None:
                raise UnknownEntry("version", f"model {model} has no version {version}")
            current = s.get(ModelAliasRow, (model, alias))
            if current is None:
                s.add(ModelAliasRow(model=model, alias=alias, version=version))
            else:
                current.version = version
            s.flush()
            return model_view(s, row)


def insert_runs(s: Session, runs: Sequence[tuple[str, ModelRun]]) -> None:
    """Record each ``(job id, run)`` in transaction ``s`` (the jobs' own)."""
    for job_id, run in runs:
        s.add(
            ModelRunRow(
                job_id=job_id,
                model=run.model,
                params=dict(run.params),
                dataset_version_id=run.dataset_version_id,
                checkpoint=run.checkpoint,
            )
        )
    s.flush()


def record_output(s: Session, job_id: str, now: float) -> None:
    """The job just succeeded: if a model started it, register its output as the
    model's next version (checkpoint, latest value of each metric, parameters, dataset
    version), in transaction ``s``."""
    run = s.get(ModelRunRow, job_id)
    if run is None:
        return
    latest = s.scalar(
        select(func.max(ModelVersionRow.version)).where(ModelVersionRow.model == run.model)
    )
    metrics = _final_metrics(s, job_id)
    s.add(
        ModelVersionRow(
            model=run.model,
            version=int(latest or 0) + 1,
            job_id=job_id,
            checkpoint=run.checkpoint,
            metrics=metrics,
            params=dict(run.params),
            dataset_version_id=run.dataset_version_id,
            created_at=now,
        )
    )


def refresh_output_metrics(s: Session, job_id: str) -> None:
    """Metrics of a succeeded job arrived: its model version's final metrics take them
    (a worker's last report may reach the store after the job ended)."""
    version = s.scalars(select(ModelVersionRow).where(ModelVersionRow.job_id == job_id)).first()
    if version is not None:
        s.flush()
        version.metrics = _final_metrics(s, job_id)


def _final_metrics(s: Session, job_id: str) -> dict[str, float]:
    """The latest value (by step) of each metric the job reported."""
    metrics: dict[str, float] = {}
    for values in s.scalars(
        select(MetricRow.values)
        .where(MetricRow.job_id == job_id)
        .order_by(MetricRow.step, MetricRow.id)
    ):
        metrics.update(values or {})
    return metrics


def _users(s: Session, version_ids: Sequence[int]) -> str:
    """What uses any of these dataset versions, for a refusal; ``""`` if nothing: the
    model versions trained on them, and the runs reading them that have not ended."""
    if not version_ids:
        return ""
    ids = list(version_ids)
    trained = s.execute(
        select(DatasetVersionRow.version, ModelVersionRow.model, ModelVersionRow.version)
        .join(ModelVersionRow, ModelVersionRow.dataset_version_id == DatasetVersionRow.id)
        .where(DatasetVersionRow.id.in_(ids))
        .order_by(ModelVersionRow.model, ModelVersionRow.version)
    )
    found = [f"version {v} trained model version {m}:{mv}" for v, m, mv in trained]
    active = [state.value for state in ACTIVE_STATES]
    reading = s.execute(
        select(DatasetVersionRow.version, ModelRunRow.job_id)
        .join(ModelRunRow, ModelRunRow.dataset_version_id == DatasetVersionRow.id)
        .join(JobRow, JobRow.id == ModelRunRow.job_id)
        .where(DatasetVersionRow.id.in_(ids), JobRow.state.in_(active))
        .order_by(ModelRunRow.job_id)
    )
    found += [f"version {v} is read by job {job_id}" for v, job_id in reading]
    return "; ".join(found)
