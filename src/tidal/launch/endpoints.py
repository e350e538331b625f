"""Where a multi-role job's replicas are reached: the address of a slot's host, and ports
free there.

A ``tf`` replica listens at the address its ``TF_CONFIG`` names, and an ``mpi`` launcher
is handed its workers' hosts. On one machine every slot is ``127.0.0.1`` and a port bound
here is free for the replicas too (:class:`LoopbackNetwork`). A backend whose slots are on
other machines (the Ray backend's nodes) gives :class:`~tidal.launch.groups.roles.
RoleGroups` a :class:`SlotNetwork` of its own that knows each slot's node address and asks
the node itself for free ports.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Protocol

__all__ = ["LoopbackNetwork", "SlotNetwork", "free_ports"]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports the OS gave for ``host`` (all bound at 0 at once and read
    back, then released)."""
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


class SlotNetwork(Protocol):
    """How a backend's slots (``host:i`` names) are reached over the network."""

    def address(self, slot: str) -> str:
        """The address other replicas reach a process on ``slot`` at (its host's IP)."""
        ...

    def free_ports(self, slots: Sequence[str]) -> list[int]:
        """One port free on each slot's host, in the order of ``slots``; distinct for
        slots of one host."""
        ...


class LoopbackNetwork:
    """Every slot on this machine, reached at ``host`` (default ``127.0.0.1``)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        """Slots are reached at ``host``; ports are bound there."""
        self.host = host

    def address(self, slot: str) -> str:
        """``host``, whatever the slot."""
        return self.host

    def free_ports(self, slots: Sequence[str]) -> list[int]:
        """Ports bound on ``host`` here, one per slot."""
        return free_ports(len(slots), self.host)
