"""Durable checkpoints: a file is either absent or complete, never half-written.

Written to a temporary name in the same folder, flushed and fsynced, renamed over the final
name (atomic on POSIX), and the folder fsynced so the rename itself survives a crash.
:class:`CheckpointClock` says when the next one is due; a full disk (:func:`disk_full`)
costs that checkpoint, not the training.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("tidal.checkpoint")

_NAME = re.compile(r"^checkpoint-(\d+)\.pt$")


def checkpoint_path(directory: str | Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives."""
    return Path(directory) / f"checkpoint-{step:09d}.pt"


def save_atomic(state: dict[str, Any], directory: str | Path, step: int, *, keep: int = 2) -> Path:
    """Write ``state`` as the checkpoint of ``step``; keep the newest ``keep`` checkpoints."""
    folder = Path(directory)
    # The owner's only, whatever the worker's umask: a checkpoint holds the whole model.
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    final = checkpoint_path(folder, step)
    tmp = folder / f".{final.name}.{os.getpid()}.tmp"
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk must not keep what it could not finish
        raise
    os.replace(tmp, final)
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for old in list_checkpoints(folder)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    log.info("checkpoint step=%d path=%s", step, final)
    return final


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Complete checkpoints in ``directory``, oldest first."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def load_latest(directory: str | Path) -> dict[str, Any] | None:
    """The newest checkpoint that loads, or ``None`` if there is none."""
    for path in reversed(list_checkpoints(directory)):
        try:
            # Our own files: they hold RNG states (numpy arrays), which weights_only refuses.
            state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc:
            log.warning("skipping unreadable checkpoint %s: %s", path, exc)
            continue
        log.info("resuming from %s", path)
        return state
    return None


class CheckpointClock:
    """When the next checkpoint is due: ``every_steps`` steps or ``every_seconds`` seconds
    (either 0: never) after the last one written, or resumed from."""

    def __init__(self) -> None:
        self.last_step = 0
        self.last_time = time.monotonic()

    def due(self, step: int, every_steps: int, every_seconds: float) -> bool:
        """Whether a checkpoint is due at ``step``."""
        if every_steps > 0 and step - self.last_step >= every_steps:
            return True
        return every_seconds > 0 and time.monotonic() - self.last_time >= every_seconds

    def reset(self, step: int) -> None:
        """Count from ``step``, now: a checkpoint was written (or skipped) here."""
        self.last_step = step
        self.last_time = time.monotonic()


def disk_full(error: BaseException) -> bool:
    """Whether ``error`` or one it was raised from is a full disk (torch's writer reports
    one as a ``RuntimeError`` raised from the ``OSError``)."""
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
