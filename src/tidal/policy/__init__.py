"""Scheduling policies: pure functions over plain dataclasses (see :mod:`tidal.policy.api`)."""

from tidal.policy.api import Allocation, Cluster, Host, JobRequest, Policy, Slot, ThroughputModel

__all__ = ["Allocation", "Cluster", "Host", "JobRequest", "Policy", "Slot", "ThroughputModel"]
