"""Durable shard checkpoints, consistent across servers at a version.

Every server writes its shard (values, optimizer state, the workers' data positions it
keeps) when its version is a multiple of ``checkpoint_every``, to
``<dir>/shard<i>-of<n>-v<version>.pt``: written to a temporary file, fsynced, renamed
into place and the directory fsynced, so a file that exists is whole. The job's latest
consistent checkpoint is the highest version for which every shard's file exists; a
restarted server restores its shard from that version.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

import torch

KEEP = 3  # versions each server keeps (older files are removed)
_NAME = re.compile(r"shard(\d+)-of(\d+)-v(\d+)\.pt$")


def shard_path(directory: str, shard: int, n_ps: int, version: int) -> Path:
    """The file of ``shard`` at ``version``."""
    return Path(directory) / f"shard{shard}-of{n_ps}-v{version:010d}.pt"


def write_shard(
    directory: str, shard: int, n_ps: int, version: int, payload: dict[str, Any]
) -> Path:
    """Write one shard's checkpoint atomically and durably; prune this shard's old ones."""
    path = shard_path(directory, shard, n_ps, version)
    save_atomically(path, payload)
    for old in sorted(versions_of(directory, shard, n_ps))[:-KEEP]:
        with contextlib.suppress(FileNotFoundError):
            shard_path(directory, shard, n_ps, old).unlink()
    return path


def save_atomically(path: Path, payload: dict[str, Any]) -> None:
    """``torch.save`` ``payload`` to ``path`` so that a file there is always whole: a
    temporary file, fsynced, renamed into place, the folder fsynced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as fh:
        torch.save(payload, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def versions_of(directory: str, shard: int, n_ps: int) -> set[int]:
    """Versions at which ``shard`` has a complete checkpoint file."""
    out: set[int] = set()
    root = Path(directory)
    if not root.is_dir():
        return out
    for entry in root.iterdir():
        m = _NAME.match(entry.name)
        if m and int(m[1]) == shard and int(m[2]) == n_ps:
            out.add(int(m[3]))
    return out


def latest_consistent(directory: str, n_ps: int) -> int | None:
    """The highest version every shard has a checkpoint of, or ``None``."""
    common: set[int] | None = None
    for shard in range(n_ps):
        have = versions_of(directory, shard, n_ps)
        common = have if common is None else common & have
    return max(common) if common else None


def read_shard(directory: str, shard: int, n_ps: int, version: int) -> dict[str, Any]:
    """Load one shard's checkpoint (plain tensors and dicts only)."""
    payload = torch.load(shard_path(directory, shard, n_ps, version), weights_only=True)
    if not isinstance(payload, dict):
        raise ValueError(f"checkpoint of shard {shard} at version {version} is malformed")
    return payload
