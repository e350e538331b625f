"""The elastic runtime that runs inside each worker process."""

from tidal.runtime.adaptive import AdaptiveBatch
from tidal.runtime.api import EXIT_RELEASED, RuntimeConfig
from tidal.runtime.context import PeerLost, WorkerContext, current, init
from tidal.runtime.data import ElasticDataLoader
from tidal.runtime.lr_scaling import adaptive_lr
from tidal.runtime.parallel import ElasticDataParallel
from tidal.runtime.report import log_metrics
from tidal.runtime.sample_rng import PerSampleDropout, per_sample_dropout, sample_rand_like
from tidal.runtime.state import State
from tidal.runtime.trainer import FitResult, Trainer

__all__ = [
    "EXIT_RELEASED",
    "AdaptiveBatch",
    "ElasticDataLoader",
    "ElasticDataParallel",
    "FitResult",
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
    "per_sample_dropout",
    "sample_rand_like",
]
