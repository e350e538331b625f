"""Starting and resizing a job's worker processes (used by ``tidal run`` and backends)."""

from tidal.launch.group import GroupEvent, Outcome, Worker, WorkerGroup, WorkerSpec, WorkerState

__all__ = ["GroupEvent", "Outcome", "Worker", "WorkerGroup", "WorkerSpec", "WorkerState"]
