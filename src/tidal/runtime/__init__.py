"""The elastic runtime that runs inside each worker process."""

from tidal.runtime.api import EXIT_RELEASED, RuntimeConfig
from tidal.runtime.context import PeerLost, WorkerContext, current, init
from tidal.runtime.data import ElasticDataLoader
from tidal.runtime.parallel import ElasticDataParallel
from tidal.runtime.state import State

__all__ = [
    "EXIT_RELEASED",
    "ElasticDataLoader",
    "ElasticDataParallel",
    "PeerLost",
    "RuntimeConfig",
    "State",
    "WorkerContext",
    "current",
    "init",
]
