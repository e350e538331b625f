"""The elastic runtime that runs inside each worker process.

Each name loads its module (and torch with it) on first use, so a light module of the
package (:mod:`tidal.runtime.env`: the environment contract) imports without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidal.runtime.adaptive import AdaptiveBatch
    from tidal.runtime.context import PeerLost, WorkerContext, current, init
    from tidal.runtime.data import ElasticDataLoader
    from tidal.runtime.env import EXIT_RELEASED, RuntimeConfig
    from tidal.runtime.job_params import Params, params
    from tidal.runtime.lr_scaling import adaptive_lr
    from tidal.runtime.lr_schedule import progress_lr
    from tidal.runtime.parallel import ElasticDataParallel
    from tidal.runtime.report import log_metrics
    from tidal.runtime.sample_rng import PerSampleDropout, per_sample_dropout, sample_rand_like
    from tidal.runtime.state import State
    from tidal.runtime.trainer import FitResult, Trainer

#: Each public name and the module that defines it.
_HOMES = {
    "AdaptiveBatch": "tidal.runtime.adaptive",
    "EXIT_RELEASED": "tidal.runtime.env",
    "RuntimeConfig": "tidal.runtime.env",
    "PeerLost": "tidal.runtime.context",
    "WorkerContext": "tidal.runtime.context",
    "current": "tidal.runtime.context",
    "init": "tidal.runtime.context",
    "ElasticDataLoader": "tidal.runtime.data",
    "adaptive_lr": "tidal.runtime.lr_scaling",
    "progress_lr": "tidal.runtime.lr_schedule",
    "ElasticDataParallel": "tidal.runtime.parallel",
    "Params": "tidal.runtime.job_params",
    "params": "tidal.runtime.job_params",
    "log_metrics": "tidal.runtime.report",
    "PerSampleDropout": "tidal.runtime.sample_rng",
    "per_sample_dropout": "tidal.runtime.sample_rng",
    "sample_rand_like": "tidal.runtime.sample_rng",
    "State": "tidal.runtime.state",
    "FitResult": "tidal.runtime.trainer",
    "Trainer": "tidal.runtime.trainer",
}

__all__ = [
    "EXIT_RELEASED",
    "AdaptiveBatch",
    "ElasticDataLoader",
    "ElasticDataParallel",
    "FitResult",
    "Params",
    "PeerLost",
    "PerSampleDropout",
    "RuntimeConfig",
    "State",
    "Trainer",
    "WorkerContext",
    "adaptive_lr",
    "current",
    "init",
    "log_metrics",
    "params",
    "per_sample_dropout",
    "progress_lr",
    "sample_rand_like",
]


def __getattr__(name: str) -> Any:
    """Load a public name's module on its first use (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tidal.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    """The package's names, the lazily loaded ones included."""
    return sorted(set(globals()) | set(_HOMES))
