"""Ray's own drain notices: the nodes Ray is draining, as tidal's hosts leaving.

Ray drains a node before it removes it: its autoscaler on scale-down, a cloud node
provider on a spot instance's interruption notice, or ``ray drain-node``. The GCS keeps
each draining node's id and deadline (milliseconds since the epoch; 0: none), which
``ray._private.state.state.get_draining_nodes()`` returns (the call Ray Train's
preemption handling polls). :func:`leaving_hosts` turns that into tidal's hosts and times;
the backend answers :class:`~tidal.backends.base.DrainNotices` with it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping

log = logging.getLogger("tidal.backends.ray")

__all__ = ["DRAIN_POLL", "DrainWatch", "draining_nodes", "leaving_hosts"]

#: Seconds between two looks at Ray's draining nodes: the controller asks every tick, a
#: look is a call to the GCS, and Ray's shortest drain deadline is tens of seconds.
DRAIN_POLL = 1.0


def leaving_hosts(
    node_ids: Mapping[str, str], draining: Mapping[str, int]
) -> dict[str, float | None]:
    """The hosts (by name; ``node_ids``: host → Ray node id) of the ``draining`` nodes
    (node id → deadline in ms, 0 for none), each with the time it goes in seconds."""
    by_node = {node_id: host for host, node_id in node_ids.items()}
    return {
        by_node[node_id]: (deadline_ms / 1000.0 if deadline_ms > 0 else None)
        for node_id, deadline_ms in draining.items()
        if node_id in by_node
    }


def draining_nodes() -> dict[str, int]:
    """Ray's draining nodes now (node id → deadline in ms); empty when the GCS cannot be
    asked (a failed lookup must not drain or undrain anything)."""
    import ray._private.state  # Ray's state API: loaded with the backend, not before

    try:
        return dict(ray._private.state.state.get_draining_nodes() or {})
    except Exception:
        log.warning("could not read Ray's draining nodes", exc_info=True)
        return {}


class DrainWatch:
    """Ray's draining nodes, looked up at most every ``every`` seconds."""

    def __init__(self, every: float = DRAIN_POLL) -> None:
        self.every = every
        self._draining: dict[str, int] = {}
        self._looked = -math.inf

    def leaving(self, node_ids: Mapping[str, str]) -> dict[str, float | None]:
        """The hosts (``node_ids``: host → Ray node id) Ray is draining, with deadlines."""
        if time.monotonic() - self._looked >= self.every:
            self._draining, self._looked = draining_nodes(), time.monotonic()
        return leaving_hosts(node_ids, self._draining)
