"""The environment contract of a parameter-server job's processes: the variable names a
launcher sets and :meth:`tidal.ps.config.ClusterSpec.from_env` reads back.

It imports nothing of tidal, so the launch layer and the controller can name these
variables without importing the parameter-server runtime.

==============================  ===========================================================
``TIDAL_PS_ROLE``               ``ps``, ``worker`` or ``chief`` (the observer that
                                evaluates and checkpoints; never counted as a worker)
``TIDAL_PS_INDEX``              this process's index in its role (a server's shard; a
                                worker's data stream, ``0 .. max_workers-1``)
``TIDAL_PS_WORKER_ID``          a worker's stable name (default ``worker-<index>``); a
                                worker that rejoins under it resumes its data position
``TIDAL_PS_N_PS``               number of servers (``n_ps``, at least 1)
``TIDAL_PS_ADDRESSES``          the servers' endpoints, comma-separated, in shard order
``TIDAL_PS_ADDRESS_DIR``        or: a directory where server ``i`` publishes its endpoint
                                in ``ps-<i>.addr`` (read again after a server restarts)
``TIDAL_PS_BIND``               a server's bind endpoint (default ``tcp://127.0.0.1:0``)
``TIDAL_PS_MODE``               ``sync`` or ``async``
``TIDAL_PS_REPLICAS_TO_AGGREGATE``  sync: gradients averaged per step (default: every
                                current worker)
``TIDAL_PS_MAX_WORKERS``        the most workers the job may have (data streams)
``TIDAL_PS_MAX_STALENESS``      async: versions a worker may lag before it must pull
``TIDAL_PS_CHECKPOINT_DIR``     where servers write shard checkpoints (none if unset)
``TIDAL_PS_CHECKPOINT_EVERY``   versions between checkpoints (default 50)
``TIDAL_PS_PEER_TIMEOUT``       seconds of silence after which a peer is dead (default 5)
``TIDAL_PS_RECOVER_TIMEOUT``    seconds a worker waits for a lost server to return (30)
==============================  ===========================================================
"""

from __future__ import annotations

__all__ = [
    "ENV_ADDRESSES",
    "ENV_ADDRESS_DIR",
    "ENV_BIND",
    "ENV_CHECKPOINT_DIR",
    "ENV_CHECKPOINT_EVERY",
    "ENV_INDEX",
    "ENV_MAX_STALENESS",
    "ENV_MAX_WORKERS",
    "ENV_MODE",
    "ENV_N_PS",
    "ENV_PEER_TIMEOUT",
    "ENV_RECOVER_TIMEOUT",
    "ENV_REPLICAS_TO_AGGREGATE",
    "ENV_ROLE",
    "ENV_WORKER_ID",
    "PREFIX",
]

#: Every variable of the contract starts with it.
PREFIX = "TIDAL_PS_"
ENV_ROLE = PREFIX + "ROLE"
ENV_INDEX = PREFIX + "INDEX"
ENV_WORKER_ID = PREFIX + "WORKER_ID"
ENV_N_PS = PREFIX + "N_PS"
ENV_ADDRESSES = PREFIX + "ADDRESSES"
ENV_ADDRESS_DIR = PREFIX + "ADDRESS_DIR"
ENV_BIND = PREFIX + "BIND"
ENV_MODE = PREFIX + "MODE"
ENV_REPLICAS_TO_AGGREGATE = PREFIX + "REPLICAS_TO_AGGREGATE"
ENV_MAX_WORKERS = PREFIX + "MAX_WORKERS"
ENV_MAX_STALENESS = PREFIX + "MAX_STALENESS"
ENV_CHECKPOINT_DIR = PREFIX + "CHECKPOINT_DIR"
ENV_CHECKPOINT_EVERY = PREFIX + "CHECKPOINT_EVERY"
ENV_PEER_TIMEOUT = PREFIX + "PEER_TIMEOUT"
ENV_RECOVER_TIMEOUT = PREFIX + "RECOVER_TIMEOUT"
