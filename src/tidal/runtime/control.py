"""The control channel: a small CPU ``gloo`` group formed beside each generation's main
process group.

The main group carries the gradients; on a GPU it is NCCL, whose collectives run on the
GPU's stream. Everything the runtime decides at the step boundary (the membership
agreement, the failure check after a broken generation, the adaptive batch size's
statistics) is a handful of host numbers: sent through NCCL they would have to be copied
to the device and read back, and each read drains the GPU's queue (a host
synchronisation per step). On this channel they stay in host memory and the GPU stream
never waits for them.

It also keeps failure detection off NCCL: a collective on a dead peer fails here as a gloo
connection error (or the watcher breaks it), whatever an NCCL kernel is still waiting for.

The group is built directly (not registered with ``torch.distributed``'s default world):
it lives exactly as long as its generation, under the store prefix
``tidal/ctl/<generation>/``, and is aborted, not shut down, when the generation broke.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger("tidal.runtime")


class ControlChannel:
    """The control group of one generation (every member builds it, in the same order)."""

    def __init__(
        self, store: dist.Store, generation: int, rank: int, world: int, *, timeout: float
    ) -> None:
        prefix = dist.PrefixStore(f"tidal/ctl/{generation}/", store)
        self.group: dist.ProcessGroupGloo | None = dist.ProcessGroupGloo(
            prefix, rank, world, timedelta(seconds=timeout)
        )
        self.rank = rank
        self.world_size = world

    def all_reduce_max(self, values: torch.Tensor) -> torch.futures.Future[Any]:
        """Start an element-wise maximum of the host tensor ``values`` over the group (in
        place); the future completes when every member has contributed."""
        if values.device.type != "cpu":
            raise ValueError(f"values: expected a CPU tensor, got one on {values.device}")
        if self.group is None:
            raise RuntimeError("the control channel is closed")
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp(dist.ReduceOp.MAX)
        work = self.group.allreduce([values], options)  # type: ignore[attr-defined]
        future: torch.futures.Future[Any] = work.get_future()
        return future

    def abort(self) -> None:
        """Fail every collective still pending on the group (its generation broke)."""
        if self.group is None:
            return
        try:
            self.group.abort()
        except Exception as exc:  # an older gloo without abort: the timeout ends them
            log.debug("control group abort: %s", exc)

    def close(self) -> None:
        """Leave the group (nothing pending: every member is past its last collective)."""
        self.group = None
