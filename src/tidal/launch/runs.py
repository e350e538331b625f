"""Where running ``tidal run`` launchers can be found by ``tidal resize``.

Each launcher writes ``<home>/runs/<run id>.json`` (its pid, store address and worker
bounds) and removes it when it ends; ``home`` is ``$TIDAL_HOME`` or ``~/.tidal``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path


def tidal_home() -> Path:
    """The folder for tidal's per-user state."""
    return Path(os.environ.get("TIDAL_HOME") or Path.home() / ".tidal")


@dataclass(frozen=True)
class RunRecord:
    """How to reach a running launcher."""

    run_id: str
    pid: int
    store: str
    min_workers: int
    max_workers: int


def _path(run_id: str) -> Path:
    return tidal_home() / "runs" / f"{run_id}.json"


def register(record: RunRecord) -> Path:
    """Publish ``record`` (atomically: a reader sees all of it or nothing)."""
    path = _path(record.run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(record)))
    os.replace(tmp, path)
    return path


def unregister(run_id: str) -> None:
    """Remove the run's record."""
    _path(run_id).unlink(missing_ok=True)


def lookup(run_id: str) -> RunRecord | None:
    """The record of a live run, or ``None`` (stale records of dead launchers are removed)."""
    path = _path(run_id)
    try:
        record = RunRecord(**json.loads(path.read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        return None
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        path.unlink(missing_ok=True)
        return None
    except PermissionError:
        pass
    return record
