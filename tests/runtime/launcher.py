"""Drive a real ``tidal run`` launcher from a test, and read what its workers recorded."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "elastic_digits.py"
_PID = re.compile(r"(w\d+) started on slot (\S+) \(pid (\d+)\)")


class Launch:
    """A ``tidal run`` subprocess whose output is collected line by line."""

    def __init__(self, args: list[str], *, home: Path, env: dict[str, str] | None = None) -> None:
        full_env = dict(os.environ, TIDAL_HOME=str(home), PYTHONUNBUFFERED="1")
        full_env.update(env or {})
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tidal.cli", "run", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=full_env,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.worker_pids: dict[str, int] = {}
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                if m := _PID.search(line):
                    self.worker_pids[m.group(1)] = int(m.group(3))
                self._changed.notify_all()

    def wait_for(self, predicate: Callable[[list[str]], bool], timeout: float) -> None:
        """Block until ``predicate(lines)`` holds; fail the test after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or (self.process.poll() is not None and not predicate(self.lines)):
                    if left > 0:
                        self._changed.wait(0.5)
                        if predicate(self.lines):
                            return
                    raise AssertionError(
                        "timed out waiting; output:\n" + "\n".join(self.lines[-60:])
                    )
                self._changed.wait(min(left, 0.5))

    def finish(self, timeout: float) -> int:
        """Wait for the launcher to exit; returns its status."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise AssertionError(
                "launcher did not finish; output:\n" + "\n".join(self.lines[-60:])
            ) from None
        self._reader.join(timeout=10)
        return code

    def close(self) -> None:
        """Kill the launcher and every worker it started (by pid)."""
        for pid in [self.process.pid, *self.worker_pids.values()]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def output(self) -> str:
        """Everything printed so far."""
        return "\n".join(self.lines)


def steps(out: Path) -> list[dict[str, Any]]:
    """Every committed step record of every worker."""
    records = []
    for path in sorted(out.glob("steps-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
    return records


def final_history(records: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """For each step number, the records of the last generation that committed it (an
    earlier commit of the same step was undone by a rollback). A record of a rank whose
    optimizer step was skipped (its gradient sync failed) committed nothing: that step is
    redone, or adopted from a survivor whose sync had completed."""
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        if record.get("stepped", True):
            by_step[record["step"]].append(record)
    history = {}
    for step, group in by_step.items():
        last = max(r["gen"] for r in group)
        history[step] = [r for r in group if r["gen"] == last]
    return dict(sorted(history.items()))


def assert_each_sample_once(history: dict[int, list[dict[str, Any]]], dataset_size: int) -> None:
    """Within every epoch, the committed steps consumed each sample exactly once."""
    by_epoch: dict[int, list[int]] = defaultdict(list)
    for step, group in history.items():
        if "global_indices" in group[0]:
            # The whole global batch: a peer lost mid-step after its gradient was summed
            # left no record, yet its samples were committed by the survivors.
            batch = group[0]["global_indices"]
            for record in group:
                assert record["global_indices"] == batch, f"step {step}: different batches"
                assert set(record["indices"]) <= set(batch), f"step {step}: share not in batch"
            by_epoch[group[0]["epoch"]].extend(batch)
        else:
            for record in group:
                by_epoch[record["epoch"]].extend(record["indices"])
    assert by_epoch, "no steps recorded"
    for epoch, indices in by_epoch.items():
        assert sorted(indices) == list(range(dataset_size)), (
            f"epoch {epoch}: {len(indices)} samples consumed, "
            f"{len(set(indices))} distinct, of {dataset_size}"
        )


def assert_ranks_agree(history: dict[int, list[dict[str, Any]]]) -> None:
    """After every committed step, every rank holds the same parameters, and every rank of
    the world recorded it (except in a generation's last step, where a peer may have been
    lost after its gradient was summed)."""
    last_of_gen: dict[int, int] = {}
    for step, group in history.items():
        last_of_gen[group[0]["gen"]] = max(step, last_of_gen.get(group[0]["gen"], 0))
    for step, group in history.items():
        sums = {tuple(r["checksum"]) for r in group}
        assert len(sums) == 1, f"step {step}: ranks disagree: {group}"
        if step != last_of_gen[group[0]["gen"]]:
            assert len(group) == group[0]["world"], (
                f"step {step}: {len(group)} of {group[0]['world']}"
            )


def max_relative_difference(a: Path, b: Path) -> float:
    """Largest ``|x - y| / max(|y|)`` over the tensors of two saved state dicts."""
    left, right = torch.load(a, map_location="cpu"), torch.load(b, map_location="cpu")
    worst = 0.0
    for name, ref in right.items():
        diff = (left[name] - ref).abs().max().item() / max(ref.abs().max().item(), 1e-12)
        worst = max(worst, diff)
    return worst
