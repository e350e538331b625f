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
"""

from tidal.runtime import (
    EXIT_RELEASED,
    AdaptiveBatch,
    ElasticDataLoader,
    ElasticDataParallel,
    FitResult,
    PeerLost,
    RuntimeConfig,
    State,
    Trainer,
    WorkerContext,
    adaptive_lr,
    current,
    init,
    log_metrics,
)

__version__ = "0.1.0"

__all__ = [
    "EXIT_RELEASED",
    "AdaptiveBatch",
    "ElasticDataLoader",
    "ElasticDataParallel",
    "FitResult",
    "PeerLost",
    "RuntimeConfig",
    "State",
    "Trainer",
    "WorkerContext",
    "__version__",
    "adaptive_lr",
    "current",
    "init",
    "log_metrics",
]
