"""Tokens and session ids, and the server's key that hashes them for the store.

The store keeps only ``HMAC-SHA256(key, secret)`` of each token and session id: a copy of
the database (or of a backup) reveals none of them, and without the key, which lives in
the data dir (mode 0600) and never in the store, a guess cannot be checked against it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path

__all__ = ["KEY_FILE", "ServerKey", "new_secret"]

log = logging.getLogger(__name__)

#: The data dir's file holding the server's key (hex; mode 0600).
KEY_FILE = "auth.key"


def new_secret() -> str:
    """A new token or session id: 256 random bits, URL-safe."""
    return secrets.token_urlsafe(32)


class ServerKey:
    """The server's key for hashing tokens and session ids."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 32:
            raise ValueError("the server's key must hold at least 32 bytes")
        self._key = key

    @classmethod
    def in_data_dir(cls, data_dir: Path) -> ServerKey:
        """The data dir's key, created (mode 0600) at the first start."""
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / KEY_FILE
        try:
            # O_EXCL: two servers starting at once must not each write a different key.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            text = path.read_text().strip()
            try:
                return cls(bytes.fromhex(text))
            except ValueError:
                raise RuntimeError(f"{path} does not hold a key (64 hex digits)") from None
        key = secrets.token_bytes(32)
        with os.fdopen(fd, "w") as f:
            f.write(key.hex() + "\n")
        log.info("wrote a new key for hashing tokens to %s", path)
        return cls(key)

    def digest(self, secret: str) -> str:
        """The keyed hash the store keeps of ``secret`` (64 hex digits)."""
        return hmac.new(self._key, secret.encode(), hashlib.sha256).hexdigest()

    def __repr__(self) -> str:
        return "ServerKey(<hidden>)"
