"""A real small file system for the data dir (a tmpfs), to fill up: mounting needs root,
and the tests that need it are skipped with the reason where it is refused."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

#: The tmpfs's size: small enough to fill in a moment.
SIZE_MB = 20


@contextlib.contextmanager
def mounted_tmpfs(path: Path, size_mb: int = SIZE_MB) -> Iterator[Path]:
    """``path`` (made if missing) as a tmpfs of ``size_mb`` MiB, unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (the full-disk tests run as root in CI)")
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if mount.returncode != 0:
        pytest.skip(f"mounting a tmpfs was refused: {mount.stderr.strip()}")
    try:
        yield path
    finally:
        # Lazy: a process of the test that still holds a file there must not fail it.
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def fill(path: Path) -> Path:
    """Write a file into ``path`` until its disk is full; returns the file."""
    filler = path / "filler"
    with open(filler, "wb", buffering=0) as fh:
        chunk = b"\0" * (1 << 16)
        with contextlib.suppress(OSError):
            while True:
                fh.write(chunk)
        # Then byte by byte, so not even a page is left.
        with contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * 512)
    return filler
