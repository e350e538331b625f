"""Where a multi-role job's replicas are reached on a Ray cluster: each slot at its node's
address, on ports the node itself says are free.

A port bound on the controller's machine says nothing of a node's ports, so the ports of a
``tf`` replica's address are asked of its node: one small task per node, pinned there,
binds as many ports at 0 as the node's replicas need and returns them (then releases them,
as the local backend does with ports of its own machine: a replica binds its port a moment
later).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tidal.launch.endpoints import free_ports
from tidal.launch.slot_names import slot_host

__all__ = ["RayNetwork"]

log = logging.getLogger("tidal.backends.ray")

#: Seconds a node gets to answer (a task may have to start a Ray worker process first).
_PORTS_TIMEOUT = 60.0


def _node_free_ports(count: int) -> list[int]:
    """On the node it runs on: ``count`` ports free for any of its addresses."""
    return free_ports(count, "")


class RayNetwork:
    """A :class:`~tidal.launch.endpoints.SlotNetwork` of Ray nodes.

    ``node_of`` maps a slot's host name to its node's id and address, or to ``None`` for
    a node that is gone: a replica placed there never runs, so it gets the address in the
    host's name (``<address>-<node id prefix>``) and port 0.
    """

    def __init__(self, node_of: Callable[[str], tuple[str, str] | None]) -> None:
        """Look nodes up with ``node_of``."""
        self._node_of = node_of

    def address(self, slot: str) -> str:
        """The IP address of the slot's node."""
        host = slot_host(slot)
        node = self._node_of(host)
        return node[1] if node is not None else host.rpartition("-")[0]

    def free_ports(self, slots: Sequence[str]) -> list[int]:
        """A port free on each slot's node, asked of the nodes at once (one task each).
        ``RuntimeError`` naming the node when one does not answer in time."""
        by_node: dict[str, list[int]] = {}
        for position, slot in enumerate(slots):
            node = self._node_of(slot_host(slot))
            if node is not None:
                by_node.setdefault(node[0], []).append(position)
        ports = [0] * len(slots)
        asked: list[tuple[str, Any]] = []
        for node_id, positions in by_node.items():
            options = {
                "num_cpus": 0,
                "max_retries": 0,
                "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
            }
            asked.append((node_id, _remote_task().options(**options).remote(len(positions))))
        for node_id, ref in asked:
            try:
                found = ray.get(ref, timeout=_PORTS_TIMEOUT)
            except (GetTimeoutError, RayError) as exc:
                raise RuntimeError(
                    f"node {node_id[:8]} did not give free ports for the job's tf replicas: "
                    f"{type(exc).__name__}"
                ) from exc
            for position, port in zip(by_node[node_id], found, strict=True):
                ports[position] = int(port)
        log.info("free ports on %d node(s) for %d replica(s)", len(by_node), len(slots))
        return ports


_REMOTE: Any = None


def _remote_task() -> Any:
    """The port task, declared to Ray once per process."""
    global _REMOTE
    if _REMOTE is None:
        _REMOTE = ray.remote(_node_free_ports)
    return _REMOTE
