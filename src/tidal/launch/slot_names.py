"""Slot names: how a group and its workers spell the slots the controller hands out.

The controller and the policies see a slot as a ``(host, i)`` pair
(:data:`tidal.policy.api.Slot`); a group, its workers and a backend's orders see it as a
string, ``host:i``. A worker of several GPUs holds several slots of one host and is known
by one name for all of them, ``host:2,3``. This module is the one place that writes and
reads that format (the host may itself contain ``:``: the indices follow the last one).

An index is kept as written where only the string matters (``CUDA_VISIBLE_DEVICES`` of
``tidal run``'s slots, which may be GPU UUIDs): :func:`slot_indices`. :func:`parse_slots`
turns a name into the controller's pairs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidal.policy.api import Slot

__all__ = [
    "format_slot",
    "format_slots",
    "join_slots",
    "member_names",
    "parse_slots",
    "slot_host",
    "slot_indices",
    "status_slots",
]


def join_slots(host: str, indices: Iterable[object]) -> str:
    """The name of slots ``indices`` of ``host``: ``host:2,3``, or ``host:2`` for one."""
    return f"{host}:{','.join(str(i) for i in indices)}"


def format_slot(slot: Slot) -> str:
    """``(host, i)`` as a group names it: ``host:i``."""
    return join_slots(slot[0], (slot[1],))


def format_slots(slots: Sequence[Slot]) -> str:
    """The slots of one worker, all on one host, as a group names them: ``host:i`` for
    one, ``host:2,3`` for a worker of several GPUs."""
    return join_slots(slots[0][0], (i for _, i in slots))


def slot_host(name: str) -> str:
    """The host of a slot name: ``host:2,3`` → ``host``."""
    return name.rpartition(":")[0]


def slot_indices(name: str) -> list[str]:
    """The slot indices of a name, as written: ``host:2,3`` → ``["2", "3"]``."""
    return name.rpartition(":")[2].split(",")


def parse_slots(name: str) -> tuple[Slot, ...]:
    """Every slot a worker's slot name covers: ``host:2,3`` → ``(host, 2), (host, 3)``
    (the inverse of :func:`format_slots` and :func:`format_slot`)."""
    host = slot_host(name)
    return tuple((host, int(i)) for i in slot_indices(name))


def member_names(name: str) -> list[str]:
    """The one-slot names a worker's name covers: ``host:2,3`` → ``host:2``, ``host:3``."""
    host = slot_host(name)
    return [join_slots(host, (i,)) for i in slot_indices(name)]


def status_slots(name: str) -> dict[str, Any]:
    """The slot fields of a :class:`~tidal.launch.api.WorkerStatus` for a worker named
    ``name``: ``slot``, its first slot, and ``slots``, every one when it holds several."""
    held = parse_slots(name)
    return {"slot": held[0], "slots": held if len(held) > 1 else ()}
