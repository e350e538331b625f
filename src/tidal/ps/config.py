"""The parameter-server job's configuration and the environment contract of its processes.

A launcher (the local one in :mod:`tidal.ps.launch`, or the scheduler's job kind) starts
every process of a parameter-server job with the same script and tells each what it is
through environment variables (the contract: :mod:`tidal.ps.env`);
:meth:`ClusterSpec.from_env` reads them back.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tidal.ps.env import PREFIX

Mode = Literal["sync", "async"]
Role = Literal["ps", "worker", "chief"]


@dataclass(frozen=True)
class PSConfig:
    """How a parameter-server job trains (the same for every process of the job)."""

    n_ps: int = 1
    mode: Mode = "sync"
    #: sync: gradients averaged per step; ``None`` follows the current worker count.
    replicas_to_aggregate: int | None = None
    max_workers: int = 64
    #: async: a push based on parameters more than this many versions old is refused.
    max_staleness: int | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 50
    peer_timeout: float = 5.0
    recover_timeout: float = 30.0

    def validate(self) -> PSConfig:
        """This config, or a ``ValueError`` naming the first bad field."""
        if not isinstance(self.n_ps, int) or self.n_ps < 1:
            raise ValueError(
                f"n_ps: a parameter-server job needs at least 1 server, got {self.n_ps!r}"
            )
        if self.mode not in ("sync", "async"):
            raise ValueError(f"mode: expected 'sync' or 'async', got {self.mode!r}")
        if self.max_workers < 1:
            raise ValueError(f"max_workers: expected at least 1, got {self.max_workers!r}")
        r = self.replicas_to_aggregate
        if r is not None:
            if r < 1:
                raise ValueError(f"replicas_to_aggregate: expected at least 1, got {r!r}")
            if r > self.max_workers:
                raise ValueError(
                    f"replicas_to_aggregate: {r} is larger than max_workers ({self.max_workers});"
                    " a sync step could never complete"
                )
            if self.mode == "async":
                raise ValueError("replicas_to_aggregate: only meaningful with mode 'sync'")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"max_staleness: expected >= 0, got {self.max_staleness!r}")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every: expected >= 0, got {self.checkpoint_every!r}")
        if self.peer_timeout <= 0 or self.recover_timeout < 0:
            raise ValueError("peer_timeout/recover_timeout: expected positive seconds")
        return self

    def to_env(self) -> dict[str, str]:
        """The environment variables that carry this config to a process."""
        out = {
            "N_PS": str(self.n_ps),
            "MODE": self.mode,
            "MAX_WORKERS": str(self.max_workers),
            "CHECKPOINT_EVERY": str(self.checkpoint_every),
            "PEER_TIMEOUT": str(self.peer_timeout),
            "RECOVER_TIMEOUT": str(self.recover_timeout),
        }
        if self.replicas_to_aggregate is not None:
            out["REPLICAS_TO_AGGREGATE"] = str(self.replicas_to_aggregate)
        if self.max_staleness is not None:
            out["MAX_STALENESS"] = str(self.max_staleness)
        if self.checkpoint_dir:
            out["CHECKPOINT_DIR"] = self.checkpoint_dir
        return {PREFIX + k: v for k, v in out.items()}


@dataclass(frozen=True)
class ClusterSpec:
    """What one process of a parameter-server job is, and where its servers are."""

    role: Role
    index: int
    config: PSConfig
    worker_id: str = ""
    addresses: tuple[str, ...] = ()
    address_dir: str | None = None
    bind: str = "tcp://127.0.0.1:0"

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> ClusterSpec:
        """Read the environment contract (module docstring); ``ValueError`` names a bad
        variable."""
        env = os.environ if environ is None else environ

        def get(name: str, default: str | None = None) -> str | None:
            value = env.get(PREFIX + name, "")
            return value if value != "" else default

        def number(name: str, kind: type, default: str | None) -> object:
            raw = get(name, default)
            if raw is None:
                return None
            try:
                return kind(raw)
            except ValueError:
                raise ValueError(f"{PREFIX}{name}: expected a number, got {raw!r}") from None

        role = get("ROLE")
        if role not in ("ps", "worker", "chief"):
            raise ValueError(f"{PREFIX}ROLE: expected 'ps', 'worker' or 'chief', got {role!r}")
        config = PSConfig(
            n_ps=number("N_PS", int, "1"),  # type: ignore[arg-type]
            mode=get("MODE", "sync"),  # type: ignore[arg-type]
            replicas_to_aggregate=number("REPLICAS_TO_AGGREGATE", int, None),  # type: ignore[arg-type]
            max_workers=number("MAX_WORKERS", int, "64"),  # type: ignore[arg-type]
            max_staleness=number("MAX_STALENESS", int, None),  # type: ignore[arg-type]
            checkpoint_dir=get("CHECKPOINT_DIR"),
            checkpoint_every=number("CHECKPOINT_EVERY", int, "50"),  # type: ignore[arg-type]
            peer_timeout=number("PEER_TIMEOUT", float, "5"),  # type: ignore[arg-type]
            recover_timeout=number("RECOVER_TIMEOUT", float, "30"),  # type: ignore[arg-type]
        ).validate()
        index = number("INDEX", int, "0")
        assert isinstance(index, int)
        addresses = tuple(a for a in (get("ADDRESSES") or "").split(",") if a)
        address_dir = get("ADDRESS_DIR")
        if role == "ps" and index >= config.n_ps:
            raise ValueError(f"{PREFIX}INDEX: server {index} of n_ps={config.n_ps}")
        if role == "chief" and index != 0:
            raise ValueError(f"{PREFIX}INDEX: a job has one chief (index 0), got {index}")
        if role in ("worker", "chief"):
            if role == "worker" and index >= config.max_workers:
                raise ValueError(
                    f"{PREFIX}INDEX: worker {index} of max_workers={config.max_workers}"
                )
            if not addresses and not address_dir:
                raise ValueError(f"{PREFIX}ADDRESSES or {PREFIX}ADDRESS_DIR: a {role} needs one")
            if addresses and len(addresses) != config.n_ps:
                raise ValueError(
                    f"{PREFIX}ADDRESSES: {len(addresses)} endpoints for n_ps={config.n_ps}"
                )
        return ClusterSpec(
            role=role,  # type: ignore[arg-type]
            index=index,
            config=config,
            worker_id=get("WORKER_ID", "chief" if role == "chief" else f"worker-{index}") or "",
            addresses=addresses,
            address_dir=address_dir,
            bind=get("BIND", "tcp://127.0.0.1:0") or "",
        )

    def to_env(self) -> dict[str, str]:
        """The environment variables that describe this process (inverse of ``from_env``)."""
        out = self.config.to_env()
        out[PREFIX + "ROLE"] = self.role
        out[PREFIX + "INDEX"] = str(self.index)
        out[PREFIX + "BIND"] = self.bind
        if self.worker_id:
            out[PREFIX + "WORKER_ID"] = self.worker_id
        if self.addresses:
            out[PREFIX + "ADDRESSES"] = ",".join(self.addresses)
        if self.address_dir:
            out[PREFIX + "ADDRESS_DIR"] = self.address_dir
        return out

    def server_address(self, i: int) -> str | None:
        """Server ``i``'s endpoint now: the published one if there is a directory."""
        if self.address_dir:
            path = address_file(self.address_dir, i)
            try:
                text = path.read_text().strip()
            except OSError:
                text = ""
            if text:
                return text
        return self.addresses[i] if i < len(self.addresses) else None


def address_file(directory: str, index: int) -> Path:
    """Where server ``index`` publishes its endpoint."""
    return Path(directory) / f"ps-{index}.addr"


def publish_address(directory: str, index: int, endpoint: str) -> None:
    """Write server ``index``'s endpoint atomically (readers never see half a line)."""
    path = address_file(directory, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(endpoint + "\n")
    os.replace(tmp, path)
