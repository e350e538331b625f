"""Shared plumbing of the benchmarks: processes we start (and always stop), step traces."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
TORCHRUN = str(Path(PYTHON).with_name("torchrun"))
EXAMPLE = str(ROOT / "examples" / "synthetic_mlp.py")
BASELINE = str(ROOT / "benchmarks" / "torchrun_mlp.py")


def env(**extra: str) -> dict[str, str]:
    """This environment, with ``src`` and the repository importable."""
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    out["PYTHONUNBUFFERED"] = "1"
    out.update(extra)
    return out


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A child process in its own session whose output is kept (and echoed to a log)."""

    def __init__(self, argv: list[str], log: Path, environ: dict[str, str]) -> None:
        self.argv = argv
        self.lines: list[str] = []
        self._log = open(log, "a", buffering=1)  # noqa: SIM115
        self.popen = subprocess.Popen(
            argv,
            env=environ,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self.pid = self.popen.pid
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))
            self._log.write(line)

    def sample_cpu(self, every: float = 0.1) -> list[tuple[float, float]]:
        """Start sampling this process's own CPU time (all its threads, not its children):
        a list of ``(time.time(), seconds)`` that grows until the process ends."""
        samples: list[tuple[float, float]] = []
        tick = os.sysconf("SC_CLK_TCK")

        def sample() -> None:
            while self.alive():
                try:
                    fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    return
                samples.append((time.time(), (int(fields[11]) + int(fields[12])) / tick))
                time.sleep(every)

        threading.Thread(target=sample, daemon=True).start()
        return samples

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM, wait up to ``grace`` s, then SIGKILL its process group."""
        self.signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # its own session: only what it started
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        self._reader.join(timeout=5)
        self._log.close()


def kill_pids(pids: set[int]) -> None:
    """SIGKILL processes we started (directly or through a launcher) that still run."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Trace:
    """Per-worker JSON-lines step traces in one directory (see examples/synthetic_mlp.py)."""

    directory: Path
    _offsets: dict[Path, int] = field(default_factory=dict)
    lines: list[dict[str, Any]] = field(default_factory=list)

    def refresh(self) -> list[dict[str, Any]]:
        """All complete lines so far, sorted by time."""
        if self.directory.exists():
            for path in sorted(self.directory.glob("*.jsonl")):
                offset = self._offsets.get(path, 0)
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    data = fh.read()
                end = data.rfind(b"\n") + 1
                for raw in data[:end].splitlines():
                    self.lines.append(json.loads(raw))
                self._offsets[path] = offset + end
            self.lines.sort(key=lambda d: float(d["t"]))
        return self.lines

    def rank0(self) -> list[dict[str, Any]]:
        return [d for d in self.refresh() if d["rank"] == 0]

    def pids(self) -> set[int]:
        return {int(d["pid"]) for d in self.refresh() if "pid" in d}


class Timeout(RuntimeError):
    """A bounded wait ran out."""


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise Timeout(f"waited {timeout:.0f}s for {what}")
        time.sleep(0.05)


def steady(trace: Trace, world: int, steps: int, after: float, key: str = "") -> bool:
    """Whether rank 0 has traced ``steps`` steps at ``world`` since time ``after`` (and,
    with ``key``, since its last change of that field, e.g. a new process)."""
    lines = [d for d in trace.rank0() if float(d["t"]) > after]
    if len(lines) < steps:
        return False
    tail = lines[-steps:]
    return all(d["world"] == world for d in tail) and (not key or len({d[key] for d in tail}) == 1)


def measure(lines: list[dict[str, Any]], mark: float, keys: tuple[str, ...]) -> dict[str, Any]:
    """The stall of an event started at time ``mark``, from time-ordered rank-0 lines.

    A configuration is the value of ``keys`` in a line (the world size; for torchrun also
    the process). The old one is rank 0's at ``mark``, the new one rank 0's now. Stall =
    end of the first step in the new configuration - end of the last step in the old one
    before it - median step time in the new configuration (its next 10 steps)."""

    def config(d: dict[str, Any]) -> tuple[object, ...]:
        return tuple(d[k] for k in keys)

    old = config([d for d in lines if float(d["t"]) <= mark][-1])
    new = config(lines[-1])
    i = next(i for i, d in enumerate(lines) if float(d["t"]) > mark and config(d) == new)
    first = lines[i]
    last = [d for d in lines[:i] if config(d) == old][-1]
    following = [d for d in lines[i:] if config(d) == new][:11]
    gaps = [float(b["t"]) - float(a["t"]) for a, b in itertools.pairwise(following)]
    gap = float(first["t"]) - float(last["t"])
    step_time = statistics.median(gaps) if gaps else float("nan")
    switch = [d["switch"] for d in lines[lines.index(last) : i + 1] if "switch" in d]
    return {
        "switch": switch[-1] if switch else None,
        "from": last["world"],
        "to": first["world"],
        "step": first["step"],
        "gap": gap,
        "step_time": step_time,
        "stall": gap - step_time,
        "redone": max(0, int(last["step"]) - int(first["step"]) + 1),
    }


@contextlib.contextmanager
def cleanup(procs: list[Proc], extra_pids: Callable[[], set[int]]) -> Iterator[None]:
    """Stop every process started in the block, whatever happens."""
    try:
        yield
    finally:
        for proc in reversed(procs):
            proc.stop()
        kill_pids(extra_pids())


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
