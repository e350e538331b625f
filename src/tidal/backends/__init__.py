"""Backends start, stop and watch a job's worker processes; they never decide anything."""

from tidal.backends.base import Backend

__all__ = ["Backend"]
