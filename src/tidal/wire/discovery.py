"""What the CLI and SDK find in the data dir: the running server's URL (a small file) and
the admin token. Light on purpose: the SDK imports it."""

from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "SERVER_FILE",
    "SOURCE_HEADER",
    "TOKEN_FILE",
    "ServerInfo",
    "clear_server_info",
    "default_data_dir",
    "read_server_info",
    "read_token",
    "write_server_info",
]

log = logging.getLogger(__name__)

SERVER_FILE = "server.json"
TOKEN_FILE = "token"
#: The header the CLI (``cli``) and the SDK (``api``) send to say where a change comes
#: from, for the audit trail.
SOURCE_HEADER = "X-Tidal-Client"


def default_data_dir() -> Path:
    """``$TIDAL_DATA_DIR``, else ``~/.tidal``."""
    env = os.environ.get("TIDAL_DATA_DIR")
    return Path(env).expanduser() if env else Path.home() / ".tidal"


@dataclass(frozen=True)
class ServerInfo:
    """A running server: where to reach it and which process it is."""

    url: str
    pid: int


def write_server_info(data_dir: Path, info: ServerInfo) -> Path:
    """Record the server's URL atomically (write, then rename)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / SERVER_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"url": info.url, "pid": info.pid}) + "\n")
    tmp.replace(path)
    return path


def read_server_info(data_dir: Path) -> ServerInfo | None:
    """The server recorded in ``data_dir``, if any and readable."""
    try:
        data = json.loads((data_dir / SERVER_FILE).read_text())
        return ServerInfo(url=str(data["url"]), pid=int(data["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def clear_server_info(data_dir: Path, pid: int) -> None:
    """Remove the record if it still names process ``pid`` (a newer server may own it)."""
    info = read_server_info(data_dir)
    if info is not None and info.pid == pid:
        (data_dir / SERVER_FILE).unlink(missing_ok=True)


def read_token(data_dir: Path) -> str | None:
    """The admin token stored in ``data_dir``, if any."""
    path = data_dir / TOKEN_FILE
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError:
        return None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("%s is readable by other users; chmod 600 it", path)
    return text or None
