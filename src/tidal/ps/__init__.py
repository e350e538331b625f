"""Parameter-server training: sharded parameters, optimizers on the servers, sync or async.

The names are imported on first use, so ``import tidal.ps`` costs nothing until then (the
configuration and the launcher do not need torch or ZeroMQ). See :mod:`tidal.ps.api`.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "ClusterSpec": "tidal.ps.config",
    "PSConfig": "tidal.ps.config",
    "ShardedLoader": "tidal.ps.data",
    "LocalCluster": "tidal.ps.launch",
    "ShardLayout": "tidal.ps.shard",
    "plan_shards": "tidal.ps.shard",
    "ParameterServerError": "tidal.ps.transport",
    "ServerLost": "tidal.ps.transport",
    "ParameterServerModel": "tidal.ps.worker",
    "init": "tidal.ps.api",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tidal.ps' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
