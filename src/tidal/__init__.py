"""tidal: elastic, multi-job training on a shared pool of GPUs.

Inside a training script::

    import tidal
    ctx = tidal.init()
    model = tidal.ElasticDataParallel(model)
    loader = tidal.ElasticDataLoader(dataset, batch_size=256)   # the global batch
    state = tidal.State(model=model, optimizer=opt, loader=loader)
    for epoch in state.epochs(10):
        for x, y in loader:
            ...
            state.step()
        tidal.log_metrics(loss=loss.item())    # buffered; sent about once a second

``tidal.params(epochs=10, lr=0.1)`` reads the job's parameters (``tidal train --set``),
with the script's defaults where the job gives none.

The training API lives in :mod:`tidal.runtime` and loads (with torch) on first use of one
of these names, so ``import tidal.client`` or the ``tidal`` command stay light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidal.runtime import (
        EXIT_RELEASED,
        AdaptiveBatch,
        ElasticDataLoader,
        ElasticDataParallel,
        FitResult,
        Params,
        PeerLost,
        PerSampleDropout,
        RuntimeConfig,
        State,
        Trainer,
        WorkerContext,
        adaptive_lr,
        current,
        init,
        log_metrics,
        params,
        per_sample_dropout,
        progress_lr,
        sample_rand_like,
    )

__version__ = "0.1.0"

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
    "__version__",
    "adaptive_lr",
    "current",
    "init",
    "log_metrics",
    "params",
    "per_sample_dropout",
    "progress_lr",
    "sample_rand_like",
]

#: The names above that :mod:`tidal.runtime` provides.
_RUNTIME = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> Any:
    """Load the training API on first use of one of its names (PEP 562)."""
    if name in _RUNTIME:
        value = getattr(importlib.import_module("tidal.runtime"), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module 'tidal' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The package's names, the lazily loaded ones included."""
    return sorted(set(globals()) | _RUNTIME)
