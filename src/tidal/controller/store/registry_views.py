"""The registry's rows as the API serves them: a dataset with its versions and what was
trained on each, a model with its aliases and latest version, its versions with their
lineage. Read inside a transaction of :mod:`~tidal.controller.store.registry`."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tidal.controller.store.tables import (
    DatasetRow,
    DatasetVersionRow,
    ModelAliasRow,
    ModelRow,
    ModelVersionRow,
)
from tidal.wire.registry import (
    DatasetVersionView,
    DatasetView,
    ModelVersionView,
    ModelView,
    ParamSpec,
)

__all__ = ["dataset_version_view", "dataset_view", "model_view", "version_views"]


def dataset_version_view(row: DatasetVersionRow, used_by: list[str]) -> DatasetVersionView:
    """One dataset version; ``used_by``: the model versions trained on it."""
    return DatasetVersionView(
        dataset=row.dataset,
        version=row.version,
        location=row.location,
        format=row.format,
        size=row.size,
        checksum=row.checksum,
        description=row.description,
        created_at=row.created_at,
        used_by=used_by,
    )


def dataset_view(s: Session, name: str) -> DatasetView:
    """The dataset ``name`` (which exists), its versions and what was trained on each."""
    row = s.get(DatasetRow, name)
    assert row is not None
    versions = list(
        s.scalars(
            select(DatasetVersionRow)
            .where(DatasetVersionRow.dataset == name)
            .order_by(DatasetVersionRow.version)
        )
    )
    used: dict[int | None, list[str]] = defaultdict(list)
    for version_id, model, version in s.execute(
        select(ModelVersionRow.dataset_version_id, ModelVersionRow.model, ModelVersionRow.version)
        .where(ModelVersionRow.dataset_version_id.in_([v.id for v in versions]))
        .order_by(ModelVersionRow.model, ModelVersionRow.version)
    ):
        used[version_id].append(f"{model}:{version}")
    return DatasetView(
        name=row.name,
        owner=row.owner,
        description=row.description,
        created_at=row.created_at,
        versions=[dataset_version_view(v, used[v.id]) for v in versions],
    )


def _aliases(s: Session, model: str) -> dict[str, int]:
    return {
        a.alias: a.version
        for a in s.scalars(
            select(ModelAliasRow).where(ModelAliasRow.model == model).order_by(ModelAliasRow.alias)
        )
    }


def model_view(s: Session, row: ModelRow) -> ModelView:
    """A model with its aliases and latest version."""
    latest = s.scalar(
        select(func.max(ModelVersionRow.version)).where(ModelVersionRow.model == row.name)
    )
    return ModelView(
        name=row.name,
        framework=row.framework,
        code=row.code,
        entry_point=row.entry_point,
        params=[ParamSpec.model_validate(p) for p in row.params or []],
        dataset=row.dataset,
        description=row.description,
        owner=row.owner,
        tags=dict(row.tags or {}),
        created_at=row.created_at,
        aliases=_aliases(s, row.name),
        latest_version=int(latest) if latest is not None else None,
    )


def version_views(s: Session, rows: list[ModelVersionRow]) -> list[ModelVersionView]:
    """Model versions with the dataset version and aliases of each."""
    ids = {r.dataset_version_id for r in rows if r.dataset_version_id is not None}
    datasets: dict[int, str] = {
        i: f"{d}:{v}"
        for i, d, v in s.execute(
            select(
                DatasetVersionRow.id, DatasetVersionRow.dataset, DatasetVersionRow.version
            ).where(DatasetVersionRow.id.in_(list(ids)))
        )
    }
    aliases: dict[int, list[str]] = defaultdict(list)
    for model in {r.model for r in rows}:
        for alias, version in _aliases(s, model).items():
            aliases[version].append(alias)
    return [
        ModelVersionView(
            model=r.model,
            version=r.version,
            job_id=r.job_id,
            checkpoint=r.checkpoint,
            metrics=dict(r.metrics or {}),
            params=dict(r.params or {}),
            dataset=datasets.get(r.dataset_version_id) if r.dataset_version_id else None,
            aliases=aliases[r.version],
            created_at=r.created_at,
        )
        for r in rows
    ]
