"""Policies and backends by name (``fairshare``) or by import path (``package.module:Class``)."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from tidal.backends.base import Backend
from tidal.policy.api import Policy

__all__ = ["BACKENDS", "POLICIES", "PluginError", "load_backend", "load_policy"]

POLICIES = {
    "fairshare": "tidal.policy.fairshare:FairSharePolicy",
    "goodput": "tidal.policy.goodput:live_policy",
    "static": "tidal.policy.static:StaticPolicy",
    "tiresias": "tidal.policy.tiresias:TiresiasPolicy",
}
BACKENDS = {
    "local": "tidal.backends.local:LocalBackend",
    # Needs the ``ray`` extra (pip install 'tidal[ray]').
    "ray": "tidal.backends.ray:RayBackend",
}


class PluginError(ValueError):
    """A policy or backend name that cannot be loaded."""


def _load(kind: str, name: str, known: dict[str, str], **options: Any) -> Any:
    target = known.get(name, name)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        choices = ", ".join(sorted(known))
        raise PluginError(f"unknown {kind} {name!r} (choose {choices}, or give module:Class)")
    try:
        module = importlib.import_module(module_name)
        factory = getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise PluginError(f"cannot load {kind} {name!r} from {target}: {exc}") from None
    # Hand a factory only the options it declares: plugins need not take them all.
    try:
        accepted = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        accepted = {}  # type: ignore[assignment]
    return factory(**{k: v for k, v in options.items() if k in accepted})


def load_policy(name: str, options: Mapping[str, str] | None = None) -> Policy:
    """A policy instance, e.g. ``load_policy("goodput", {"reallocation_delay": "5"})``.

    ``options`` are constructor arguments as text (``tidal server --policy-option K=V``),
    converted to the type of the parameter's default; unknown ones are an error."""
    target = POLICIES.get(name, name)
    converted: dict[str, Any] = {}
    if options:
        module_name, _, attr = target.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
            accepted = inspect.signature(factory).parameters
        except (ImportError, AttributeError, TypeError, ValueError) as exc:
            raise PluginError(f"cannot load policy {name!r} from {target}: {exc}") from None
        for key, text in options.items():
            if key not in accepted:
                choices = ", ".join(accepted) or "none"
                raise PluginError(f"policy {name!r} has no option {key!r} (options: {choices})")
            default = accepted[key].default
            try:
                converted[key] = (
                    type(default)(text)
                    if isinstance(default, int | float) and not isinstance(default, bool)
                    else text
                )
            except ValueError:
                raise PluginError(f"policy option {key}: not a number: {text!r}") from None
    return cast(Policy, _load("policy", name, POLICIES, **converted))


def load_backend(
    name: str, *, data_dir: Path | None = None, gpus: bool = False, **options: Any
) -> Backend:
    """A backend instance, e.g. ``load_backend("local", data_dir=d)``; ``data_dir``,
    ``gpus`` and any other option (``ray_address=...``) reach factories that take
    arguments of those names."""
    return cast(Backend, _load("backend", name, BACKENDS, data_dir=data_dir, gpus=gpus, **options))
