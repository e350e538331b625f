"""Policies and backends by name (``fairshare``) or by import path (``package.module:Class``).

Policy names come from :mod:`tidal.policy.registry`, the one table the simulator uses too.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from tidal.backends.base import Backend
from tidal.policy.api import Policy
from tidal.policy.registry import POLICIES, SERVED, PolicyError, declared_options, text_options

__all__ = ["BACKENDS", "PluginError", "load_backend", "load_policy"]

BACKENDS = {
    "local": "tidal.backends.local:LocalBackend",
    # Needs the ``ray`` extra (pip install 'tidal[ray]').
    "ray": "tidal.backends.ray:RayBackend",
}


class PluginError(ValueError):
    """A policy or backend name that cannot be loaded."""


def _factory(kind: str, name: str, known: Mapping[str, str]) -> Callable[..., Any]:
    """The factory ``name`` stands for: a known name or ``module:attribute``."""
    target = known.get(name, name)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        choices = ", ".join(sorted(known))
        raise PluginError(f"unknown {kind} {name!r} (choose {choices}, or give module:Class)")
    try:
        return cast(Callable[..., Any], getattr(importlib.import_module(module_name), attr))
    except (ImportError, AttributeError) as exc:
        raise PluginError(f"cannot load {kind} {name!r} from {target}: {exc}") from None


def load_policy(name: str, options: Mapping[str, str] | None = None) -> Policy:
    """A policy instance, e.g. ``load_policy("goodput", {"reallocation_delay": "5"})``.

    ``options`` are constructor arguments as text (``tidal server --policy-option K=V``),
    converted to the type of the parameter's default; unknown ones are an error."""
    factory = _factory("policy", name, {n: POLICIES[n].target for n in SERVED})
    try:
        converted = text_options(name, factory, options or {})
    except PolicyError as exc:
        raise PluginError(str(exc)) from None
    return cast(Policy, factory(**converted))


def load_backend(
    name: str, *, data_dir: Path | None = None, gpus: bool = False, **options: Any
) -> Backend:
    """A backend instance, e.g. ``load_backend("local", data_dir=d)``; ``data_dir``,
    ``gpus`` and any other option (``ray_address=...``) reach factories that take
    arguments of those names."""
    factory = _factory("backend", name, BACKENDS)
    chosen = declared_options(factory, {"data_dir": data_dir, "gpus": gpus, **options})
    return cast(Backend, factory(**chosen))
