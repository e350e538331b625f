"""Launching elastic jobs: the worker group, its driver for backends, and ``tidal run``."""

from tidal.launch.group import GroupEvent, Outcome, WorkerGroup
from tidal.launch.worker import Worker, WorkerPhase, WorkerSpec

__all__ = ["GroupEvent", "Outcome", "Worker", "WorkerGroup", "WorkerPhase", "WorkerSpec"]
