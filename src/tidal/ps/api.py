"""The public surface of parameter-server training (``tidal.ps``).

In a script, two lines differ from single-process training::

    model = tidal.ps.ParameterServerModel(net, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    loader = tidal.ps.ShardedLoader(dataset, batch_size=32, model=model)
    for x, y in loader:
        loss_fn(model(x), y).backward()     # model(x) pulls the current parameters first
        model.push()                        # the servers' optimizers apply the gradient

On a ``ps`` process the first line serves that process's shard and exits with the job; on
the job's ``chief`` it is an observer that pulls and never pushes (``model.is_chief``,
``model.checkpoints()``, ``model.save(path)``).
"""

from __future__ import annotations

from tidal.ps.config import ClusterSpec, PSConfig
from tidal.ps.data import ShardedLoader
from tidal.ps.launch import LocalCluster
from tidal.ps.shard import ShardLayout, plan_shards
from tidal.ps.transport import ParameterServerError, ServerLost
from tidal.ps.worker import ParameterServerModel


def init() -> ClusterSpec:
    """This process's place in the job, read from the environment contract."""
    return ClusterSpec.from_env()


__all__ = [
    "ClusterSpec",
    "LocalCluster",
    "PSConfig",
    "ParameterServerError",
    "ParameterServerModel",
    "ServerLost",
    "ShardLayout",
    "ShardedLoader",
    "init",
    "plan_shards",
]
