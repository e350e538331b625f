"""The SDK's registry verbs: datasets, models, their versions and aliases, and training
a model with parameters.

Mixed into :class:`tidal.client.Client`, whose transport (``_request``) they use; they
import nothing of it. The bodies are :mod:`tidal.wire.registry`.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tidal.wire.registry import (
    DatasetIn,
    DatasetVersionView,
    DatasetView,
    ModelIn,
    ModelVersionView,
    ModelView,
    TrainRequest,
)
from tidal.wire.schema import Submitted

if TYPE_CHECKING:
    import httpx

__all__ = ["RegistryVerbs"]


class RegistryVerbs:
    """``register_dataset``, ``datasets``, ``dataset``, ``delete_dataset``,
    ``register_model``, ``models``, ``model``, ``model_versions``, ``set_alias`` and
    ``train``."""

    if TYPE_CHECKING:

        def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response: ...

    # -- datasets ---------------------------------------------------------------------------

    def register_dataset(
        self, name: str, location: str, *, format: str = "", description: str = ""
    ) -> DatasetVersionView:
        """Register a dataset version (a new dataset, or its next version): a local path
        on the server's host, whose size and checksum it measures, or a URL."""
        body = DatasetIn(name=name, location=location, format=format, description=description)
        response = self._request("POST", "/datasets", json=body.model_dump(mode="json"))
        return DatasetVersionView.model_validate(response.json())

    def datasets(self) -> builtins.list[DatasetView]:
        """Every dataset with its versions."""
        response = self._request("GET", "/datasets")
        return [DatasetView.model_validate(d) for d in response.json()]

    def dataset(self, name: str) -> DatasetView:
        """One dataset, its versions and what was trained on each."""
        return DatasetView.model_validate(self._request("GET", f"/datasets/{name}").json())

    def delete_dataset(self, name: str, version: int | None = None) -> None:
        """Delete one version, or the whole dataset; refused (Conflict) while in use."""
        params = {"version": version} if version is not None else {}
        self._request("DELETE", f"/datasets/{name}", params=params)

    # -- models -----------------------------------------------------------------------------

    def register_model(self, model: ModelIn | Mapping[str, Any]) -> ModelView:
        """Register a model (:class:`~tidal.wire.registry.ModelIn` or its fields)."""
        body = model if isinstance(model, ModelIn) else ModelIn.model_validate(dict(model))
        response = self._request("POST", "/models", json=body.model_dump(mode="json"))
        return ModelView.model_validate(response.json())

    def models(self) -> builtins.list[ModelView]:
        """Every registered model."""
        return [ModelView.model_validate(m) for m in self._request("GET", "/models").json()]

    def model(self, name: str) -> ModelView:
        """One model."""
        return ModelView.model_validate(self._request("GET", f"/models/{name}").json())

    def model_versions(self, name: str) -> builtins.list[ModelVersionView]:
        """A model's versions with their lineage, oldest first."""
        response = self._request("GET", f"/models/{name}/versions")
        return [ModelVersionView.model_validate(v) for v in response.json()]

    def set_alias(self, name: str, alias: str, version: int) -> ModelView:
        """Point ``alias`` of model ``name`` at ``version``."""
        response = self._request(
            "PUT", f"/models/{name}/aliases/{alias}", json={"version": version}
        )
        return ModelView.model_validate(response.json())

    def train(
        self,
        model: str,
        *,
        dataset: str | None = None,
        params: Mapping[str, Any] | None = None,
        workers: str | int = 1,
        priority: int | None = None,
    ) -> Submitted:
        """Train ``model``: a job running its entry point with ``params`` (checked against
        the model's; text is read as the parameter's type), on ``dataset`` (``NAME`` or
        ``NAME:VERSION``, the model's own by default)."""
        body = TrainRequest(
            dataset=dataset, params=dict(params or {}), workers=workers, priority=priority
        )
        response = self._request(
            "POST", f"/models/{model}/train", json=body.model_dump(mode="json", exclude_none=True)
        )
        return Submitted.model_validate(response.json())
