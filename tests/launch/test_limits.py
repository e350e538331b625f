"""A worker's CPUs and memory: how they are carried, which CPUs a slot gets, how a
failure for memory is told from any other, and a real process held to its limits."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from tidal.launch.failure_cause import last_exception
from tidal.launch.limits import (
    ENV_CPUS,
    ENV_MEMORY,
    WorkerLimits,
    cpu_choice,
    delegated_cgroup,
    format_bytes,
    memory_cause,
)
from tidal.launch.process import LocalSpawner

GIB = 1 << 30


def test_limits_travel_in_the_environment_and_back() -> None:
    limits = WorkerLimits(cpus=1.5, memory=2 * GIB)
    assert limits.env() == {ENV_CPUS: "1.5", ENV_MEMORY: str(2 * GIB)}
    assert WorkerLimits.from_env(limits.env()) == limits
    assert WorkerLimits.from_env({}).empty
    # A malformed value is no limit rather than a worker that cannot start.
    assert WorkerLimits.from_env({ENV_CPUS: "many", ENV_MEMORY: "-1"}).empty


def test_each_slot_gets_its_own_cpus_while_there_are_enough() -> None:
    cpus = list(range(8))
    assert cpu_choice(1, 0, cpus) == (0,)
    assert cpu_choice(1, 3, cpus) == (3,)
    assert cpu_choice(2, 1, cpus) == (2, 3)
    assert cpu_choice(1.5, 1, cpus) == (2, 3)  # a part of a CPU takes a whole one
    assert cpu_choice(3, 2, cpus) == (0, 6, 7)  # wraps round
    assert cpu_choice(64, 0, [2, 5]) == (2, 5)  # never more than the host has
    assert cpu_choice(1, 0, []) == ()


def test_bytes_are_shown_as_the_spec_writes_them() -> None:
    assert format_bytes(2 * GIB) == "2 GiB"
    assert format_bytes(512 << 20) == "512 MiB"
    assert format_bytes(1536 << 20) == "1.5 GiB"
    assert format_bytes(100) == "100 bytes"


def test_a_failed_allocation_is_told_from_other_failures() -> None:
    said = "exceeded its memory limit of 2 GiB"
    assert memory_cause(2 * GIB, "MemoryError", False) == said
    assert memory_cause(2 * GIB, "RuntimeError: DefaultCPUAllocator: can't allocate memory", False)
    assert memory_cause(2 * GIB, None, True) == said  # the kernel's OOM killer, in a cgroup
    assert memory_cause(2 * GIB, "ValueError: lr must be positive", False) is None
    assert memory_cause(2 * GIB, "torch.OutOfMemoryError: CUDA out of memory", False) is None
    assert memory_cause(None, "MemoryError", False) is None  # no limit: a plain failure


def _run(env: dict[str, str], script: str, slot: str = "host:0") -> tuple[int, str]:
    lines: list[str] = []
    lock = threading.Lock()

    def on_line(line: str) -> None:
        with lock:
            lines.append(line)

    process = LocalSpawner().spawn(
        worker_id="w0",
        slot=slot,
        argv=[sys.executable, "-c", script],
        env=env,
        cwd=None,
        on_line=on_line,
    )
    code = process.wait(timeout=60)
    if code is None:
        process.kill()
        process.wait(timeout=10)
    process.drain(timeout=10)
    assert code is not None, "the worker did not end"
    with lock:
        return code, "".join(lines)


@pytest.mark.skipif(delegated_cgroup() is not None, reason="limits enforced by a cgroup here")
def test_a_worker_past_its_memory_limit_fails_to_allocate() -> None:
    env = WorkerLimits(memory=256 << 20).env()
    code, output = _run(env, "x = bytearray(1 << 30)\nprint('allocated')")
    assert code == 1, output
    assert "allocated" not in output
    assert last_exception(output) == "MemoryError"
    # The same allocation without a limit succeeds: the limit is what stopped it.
    assert _run({}, "x = bytearray(1 << 30)\nprint('allocated')") == (0, "allocated\n")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs at least 2 CPUs")
def test_a_worker_runs_on_as_many_cpus_as_it_asked_for() -> None:
    mine = sorted(os.sched_getaffinity(0))
    script = "import os; print(sorted(os.sched_getaffinity(0)))"
    env = WorkerLimits(cpus=1.0).env()
    assert _run(env, script, "host:0") == (0, f"[{mine[0]}]\n")
    assert _run(env, script, "host:1") == (0, f"[{mine[1]}]\n")
    assert _run({}, script) == (0, f"{mine}\n")
