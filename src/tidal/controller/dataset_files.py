"""What a dataset's location holds, measured when a version is registered: the size and
SHA-256 of a local path's files, so a later change to them can be told apart. A URL
(``s3://``, ``https://``) is the workers' to read and is not measured."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from tidal.wire.registry import is_url

__all__ = ["Measured", "measure"]

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Measured:
    """A location's size in bytes and checksum, ``None`` for a URL."""

    size: int | None
    checksum: str | None


def measure(location: str) -> Measured:
    """The size and checksum of the file or folder at ``location`` (every file under a
    folder, in the order of their relative paths, each hashed with its path so a rename
    changes the sum). :class:`ValueError` saying why a path cannot be measured."""
    if is_url(location):
        return Measured(None, None)
    path = Path(location)
    if not path.is_absolute():
        raise ValueError(f"expected an absolute path or a URL, got {location!r}")
    if not path.exists():
        raise ValueError(f"no such file or directory on the server's host: {location}")
    digest = hashlib.sha256()
    size = 0
    files = [path] if path.is_file() else _files(path)
    for file in files:
        name = file.name if file == path else str(file.relative_to(path))
        digest.update(os.fsencode(name))
        digest.update(b"\0")
        try:
            with file.open("rb") as stream:
                while chunk := stream.read(_CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
        except OSError as exc:
            raise ValueError(f"cannot read {file}: {exc.strerror}") from None
    return Measured(size, digest.hexdigest())


def _files(folder: Path) -> list[Path]:
    """Every file under ``folder``, in the order of their relative paths."""
    found: list[Path] = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        found.extend(Path(root) / n for n in sorted(names) if (Path(root) / n).is_file())
    return sorted(found, key=lambda f: f.relative_to(folder).parts)
