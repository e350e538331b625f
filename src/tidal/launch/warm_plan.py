"""How many warm interpreters a job's agent keeps: a decision over plain values.

A newcomer started cold pays for an interpreter and ``import torch`` (seconds; tens of
seconds on a loaded host) before it can train; one taken from the pool pays nothing of
that (``launch/warm.py``). So a job that can grow keeps a small pool by default, started
once its first workers train (the pool's imports must not slow the job's own start), and
sized by the job's elastic range (a job that starts at its maximum may be shrunk and
grown again), within the host's free memory. A job that cannot
grow, or whose workers another launcher starts, keeps none. ``TIDAL_WARM_POOL=N`` in the
job's environment overrides the default (``0``: none).

The local backend's standby agent (``launch/standby.py``) keeps a pool too, for the next
job's first workers: :func:`plan_standby` sizes it by the host's slots and free memory
(``tidal server --standby-workers N`` overrides it; ``0``: no standby).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_POOL",
    "DEFAULT_STANDBY",
    "ENV_WARM_POOL",
    "INTERPRETER_BYTES",
    "MEMORY_RESERVE",
    "WarmPoolPlan",
    "available_memory",
    "plan_standby",
    "plan_warm_pool",
    "requested_pool",
]

#: Set in a job's environment to choose its pool's size (``0``: no pool).
ENV_WARM_POOL = "TIDAL_WARM_POOL"

#: The pool a job that can grow keeps by default: two newcomers in quick succession (a
#: slot handed over, then another) both start warm.
DEFAULT_POOL = 2

#: What one waiting interpreter holds (torch and ``torch._dynamo`` imported: ~370 MB
#: resident on x86-64 Linux, torch 2.13), rounded up.
INTERPRETER_BYTES = 400 << 20

#: Memory a default pool leaves free on the host for the workers themselves.
MEMORY_RESERVE = 2 << 30

#: The most interpreters a standby keeps by default: a new job's first workers on a
#: small host all start warm; a larger job's others start cold.
DEFAULT_STANDBY = 4


@dataclass(frozen=True)
class WarmPoolPlan:
    """The pool a job's agent keeps, and why (for its log)."""

    size: int
    reason: str


def requested_pool(env: Mapping[str, str]) -> int | None:
    """The pool size a job's environment asks for, or ``None`` when it does not say.

    Raises ``ValueError`` naming :data:`ENV_WARM_POOL` when it is not a whole number >= 0.
    """
    raw = env.get(ENV_WARM_POOL)
    if raw is None or not raw.strip():
        return None
    if not raw.strip().isdigit():
        raise ValueError(f"{ENV_WARM_POOL}: expected a whole number >= 0, got {raw!r}")
    return int(raw)


def plan_warm_pool(
    *,
    requested: int | None,
    launcher: str,
    min_workers: int,
    max_workers: int,
    available_bytes: int | None,
) -> WarmPoolPlan:
    """The pool for a job whose group runs between ``min_workers`` and ``max_workers``
    (``max_workers`` 0: unknown, a launch of an earlier release); ``available_bytes``:
    the host's free memory (``None``: unknown)."""
    if requested is not None:
        return WarmPoolPlan(requested, f"{ENV_WARM_POOL}={requested}")
    if launcher != "tidal":
        return WarmPoolPlan(0, f"its workers are started by {launcher}")
    room = max_workers - min_workers
    if room <= 0:
        return WarmPoolPlan(0, "the job cannot grow")
    size = min(DEFAULT_POOL, room)
    reason = f"the job runs {min_workers} to {max_workers} worker(s)"
    if available_bytes is not None:
        fits = max(0, (available_bytes - MEMORY_RESERVE) // INTERPRETER_BYTES)
        if fits < size:
            return WarmPoolPlan(
                int(fits), f"{reason}, but only {available_bytes >> 20} MiB of memory is free"
            )
    return WarmPoolPlan(size, reason)


def plan_standby(
    *, requested: int | None, host_slots: int, available_bytes: int | None
) -> WarmPoolPlan:
    """The warm interpreters of the local backend's standby agent (0: no standby) on a
    host of ``host_slots`` slots with ``available_bytes`` of free memory (``None``:
    unknown); ``requested`` is ``--standby-workers`` (``None``: not given)."""
    if requested is not None:
        if requested < 0:
            raise ValueError(f"standby_workers: expected a whole number >= 0, got {requested}")
        return WarmPoolPlan(requested, f"--standby-workers {requested}")
    size = min(DEFAULT_STANDBY, max(0, host_slots))
    reason = f"up to {DEFAULT_STANDBY}, one per slot of {host_slots}"
    if available_bytes is not None:
        # The standby agent itself holds about what one interpreter does.
        fits = max(0, (available_bytes - MEMORY_RESERVE) // INTERPRETER_BYTES - 1)
        if fits < size:
            return WarmPoolPlan(
                int(fits), f"{reason}, but only {available_bytes >> 20} MiB of memory is free"
            )
    return WarmPoolPlan(size, reason)


def available_memory(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The host's available memory in bytes (Linux ``MemAvailable``), or ``None``."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
