"""Backends start, stop and watch a job's worker processes; they never decide anything."""

from tidal.backends.base import Backend, JobLaunch, JobStatus, WorkerState, WorkerStatus

__all__ = ["Backend", "JobLaunch", "JobStatus", "WorkerState", "WorkerStatus"]
