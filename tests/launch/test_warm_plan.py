"""The warm pool a job's agent keeps: who gets one by default, and how large."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.launch.warm_plan import (
    DEFAULT_POOL,
    DEFAULT_STANDBY,
    ENV_WARM_POOL,
    INTERPRETER_BYTES,
    MEMORY_RESERVE,
    available_memory,
    plan_standby,
    plan_warm_pool,
    requested_pool,
)

PLENTY = 64 << 30


def plan(
    requested: int | None = None,
    launcher: str = "tidal",
    *,
    least: int = 1,
    most: int = 4,
    free: int | None = PLENTY,
) -> int:
    return plan_warm_pool(
        requested=requested,
        launcher=launcher,
        max_workers=most,
        min_workers=least,
        available_bytes=free,
    ).size


def test_a_job_that_can_grow_keeps_a_pool_by_default() -> None:
    assert plan(least=1, most=4) == DEFAULT_POOL
    assert plan(least=3, most=4) == 1  # no more than the room to grow
    assert plan(least=4, most=4) == 0
    assert plan(least=1, most=0) == 0  # an earlier release's launch does not say
    assert plan(launcher="torchrun") == 0  # torchrun starts the workers itself


def test_the_environment_overrides_the_default() -> None:
    assert plan(requested=0) == 0
    assert plan(requested=3, least=4, most=4) == 3
    assert requested_pool({}) is None
    assert requested_pool({ENV_WARM_POOL: " 2 "}) == 2
    with pytest.raises(ValueError, match=ENV_WARM_POOL):
        requested_pool({ENV_WARM_POOL: "many"})


def test_the_default_pool_leaves_the_host_memory() -> None:
    assert plan(free=MEMORY_RESERVE + INTERPRETER_BYTES) == 1
    assert plan(free=MEMORY_RESERVE) == 0
    assert plan(free=1 << 20) == 0
    assert plan(free=None) == DEFAULT_POOL
    reason = plan_warm_pool(
        requested=None, launcher="tidal", min_workers=1, max_workers=4, available_bytes=0
    ).reason
    assert "memory" in reason


def test_available_memory_reads_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  100 kB\nMemAvailable:   2048 kB\n")
    assert available_memory(meminfo) == 2048 * 1024
    assert available_memory(tmp_path / "missing") is None


def test_the_standby_is_sized_by_the_host_slots_and_its_memory() -> None:
    def standby(slots: int = 8, free: int | None = None, requested: int | None = None) -> int:
        return plan_standby(requested=requested, host_slots=slots, available_bytes=free).size

    assert standby(slots=8) == DEFAULT_STANDBY
    assert standby(slots=2) == 2
    # The standby agent itself holds about one interpreter's memory too.
    assert standby(free=MEMORY_RESERVE + 3 * INTERPRETER_BYTES) == 2
    assert standby(free=MEMORY_RESERVE + INTERPRETER_BYTES) == 0
    assert standby(free=1 << 20) == 0
    assert "memory" in plan_standby(requested=None, host_slots=8, available_bytes=0).reason
    # Asked for: as asked, whatever the host (0: no standby).
    assert standby(requested=0) == 0
    assert standby(slots=1, free=0, requested=6) == 6
    assert "--standby-workers" in plan_standby(requested=6, host_slots=1, available_bytes=0).reason
    with pytest.raises(ValueError, match="standby_workers"):
        standby(requested=-1)
