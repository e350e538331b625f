"""What the CLI and SDK find in the data dir (the running server's URL, a small file, and
the admin token) and in the user's config (the server and token ``tidal login`` stored).
Light on purpose: the SDK imports it."""

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
    "Login",
    "ServerInfo",
    "clear_server_info",
    "default_data_dir",
    "read_login",
    "read_server_info",
    "read_token",
    "user_config_path",
    "write_login",
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


def user_config_path() -> Path:
    """``$TIDAL_CONFIG``, else ``$XDG_CONFIG_HOME/tidal/config.json`` (default
    ``~/.config``)."""
    env = os.environ.get("TIDAL_CONFIG")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "tidal" / "config.json"


@dataclass(frozen=True)
class Login:
    """What ``tidal login`` stored: a server and a user's token for it."""

    url: str
    token: str


def write_login(login: Login, path: Path | None = None) -> Path:
    """Store ``login`` in the user's config, readable by this user only (0600)."""
    path = path or user_config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps({"url": login.url, "token": login.token}) + "\n")
    tmp.chmod(0o600)
    tmp.replace(path)
    return path


def read_login(path: Path | None = None) -> Login | None:
    """What ``tidal login`` stored, if anything readable."""
    path = path or user_config_path()
    try:
        data = json.loads(path.read_text())
        return Login(url=str(data["url"]), token=str(data["token"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


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
