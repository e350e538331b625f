"""A generation's process groups: the default group its training collectives run on, and
the control channel beside it (:mod:`tidal.runtime.control`), formed when a worker joins
the generation and left when it ends. A broken generation's groups are abandoned, never
waited on (:mod:`tidal.runtime.group_release`).
"""

from __future__ import annotations

import logging
from datetime import timedelta

import torch
import torch.distributed as dist

from tidal.runtime.control import ControlChannel
from tidal.runtime.group_release import abandon_default_group, drop_later

__all__ = ["default_backend", "form_groups", "leave_groups"]

log = logging.getLogger("tidal.runtime")


def default_backend() -> str:
    """NCCL where this process has a GPU of its own, else gloo."""
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= 1 else "gloo"


def form_groups(
    backend: str, store: dist.Store, generation: int, rank: int, world_size: int, timeout: float
) -> ControlChannel:
    """Form generation ``generation``'s default process group over ``store`` (under a
    prefix of its own) and return its control channel, under another prefix of the same
    store. If the channel cannot form, :func:`leave_groups` finds the default group
    initialised and leaves it."""
    prefix = dist.PrefixStore(f"tidal/pg/{generation}/", store)
    dist.init_process_group(
        backend,
        store=prefix,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout),
    )
    return ControlChannel(store, generation, rank, world_size, timeout=timeout)


def leave_groups(
    backend: str, control: ControlChannel | None, *, formed: bool, failed: bool, timeout: float
) -> None:
    """Leave the generation's control channel and default group (``formed``: it was
    formed; left too when it is still initialised). After a failure (``failed``) nothing
    waits on them: their collectives may be blocked on a dead peer until ``timeout``."""
    if control is not None:
        if failed:
            # A control collective may be blocked on the dead peer: abort it, and let
            # the group's threads go off this thread once they have given up.
            control.abort()
            drop_later(control, after=timeout + 1.0)
        else:
            control.close()
    if not formed and not dist.is_initialized():
        return
    try:
        if backend == "nccl" and failed:
            dist.distributed_c10d._abort_process_group()
        elif failed:
            abandon_default_group(release_after=timeout + 1.0)
        else:
            dist.destroy_process_group()
    except Exception as exc:  # a broken group may refuse a clean shutdown
        log.debug("leaving a process group: %s", exc)
