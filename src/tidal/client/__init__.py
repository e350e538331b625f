"""The Python SDK over the controller's REST API.

>>> from tidal.client import Client
>>> with Client() as c:                      # finds the local server through its data dir
...     job = c.submit("job.yaml")
...     c.wait(job.id, timeout=3600)

:class:`Client` (:mod:`tidal.client.sdk`) holds the connection and the verbs on jobs and
the cluster; its worker verbs are :mod:`tidal.client.worker_verbs`, checked by
:mod:`tidal.client.workers` (and :mod:`tidal.client.ps_cluster` for a parameter-server
job) before anything is sent; what it raises is :mod:`tidal.client.errors`. Light to
import: httpx, pydantic and the spec, not torch or the server.
"""

from __future__ import annotations

from tidal.client.errors import (
    AuthError,
    ClientError,
    Conflict,
    InvalidRequest,
    NotFound,
    ServerUnavailable,
)
from tidal.client.sdk import TERMINAL_STATES, Client
from tidal.client.workers import WorkerArgumentError

# What the client's verbs return, so code using the SDK can name them from here.
from tidal.wire.cluster import ClusterView
from tidal.wire.schema import AllocationView, EventView, JobDetail, JobView, MetricsView, Submitted

__all__ = [
    "TERMINAL_STATES",
    "AllocationView",
    "AuthError",
    "Client",
    "ClientError",
    "ClusterView",
    "Conflict",
    "EventView",
    "InvalidRequest",
    "JobDetail",
    "JobView",
    "MetricsView",
    "NotFound",
    "ServerUnavailable",
    "Submitted",
    "WorkerArgumentError",
]
