"""Launching elastic jobs: the worker group, its driver for backends, and ``tidal run``.

Each name loads its module on first use, so ``tidal run``'s argument checks
(:mod:`tidal.launch.run_args`) import without the groups (and torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidal.launch.groups.api import Group, GroupEvent, JobGroup, Outcome
    from tidal.launch.groups.elastic import WorkerGroup
    from tidal.launch.worker import Worker, WorkerPhase, WorkerSpec

_HOMES = {
    "Group": "tidal.launch.groups.api",
    "GroupEvent": "tidal.launch.groups.api",
    "JobGroup": "tidal.launch.groups.api",
    "Outcome": "tidal.launch.groups.api",
    "WorkerGroup": "tidal.launch.groups.elastic",
    "Worker": "tidal.launch.worker",
    "WorkerPhase": "tidal.launch.worker",
    "WorkerSpec": "tidal.launch.worker",
}

__all__ = [
    "Group",
    "GroupEvent",
    "JobGroup",
    "Outcome",
    "Worker",
    "WorkerGroup",
    "WorkerPhase",
    "WorkerSpec",
]


def __getattr__(name: str) -> Any:
    """Load a public name's module on its first use (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tidal.launch' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
