"""Names shared by the runtime and whatever launches it: environment, exit codes, config."""

from __future__ import annotations

import os
from dataclasses import dataclass

#: A worker that left because its slot was taken back (a planned leave) exits with this
#: status, so launchers can tell "released" from "failed" without parsing logs.
EXIT_RELEASED = 75

ENV_STORE = "TIDAL_STORE"  # host:port of the job's rendezvous store
ENV_WORKER_ID = "TIDAL_WORKER_ID"
ENV_RUN_ID = "TIDAL_RUN_ID"
ENV_SLOT = "TIDAL_SLOT"
ENV_CHECKPOINT_DIR = "TIDAL_CHECKPOINT_DIR"
ENV_CHECKPOINT_EVERY_STEPS = "TIDAL_CHECKPOINT_EVERY_STEPS"
ENV_CHECKPOINT_EVERY_SECONDS = "TIDAL_CHECKPOINT_EVERY_SECONDS"
ENV_TIMEOUT = "TIDAL_TIMEOUT"
ENV_SYNC_EVERY = "TIDAL_SYNC_EVERY"
ENV_BACKEND = "TIDAL_BACKEND"
#: How gradients are all-reduced: ``auto`` (the default), ``native``, ``guarded`` or
#: ``hook`` (see :func:`tidal.runtime.parallel.choose_gradient_sync`).
ENV_GRADIENT_SYNC = "TIDAL_GRADIENT_SYNC"
GRADIENT_SYNC_MODES = ("auto", "native", "guarded", "hook")
#: A job's parameters, a JSON object (name → value), and the location (a path or a URL)
#: of the dataset it trains on: what ``tidal.params()`` reads.
ENV_PARAMS = "TIDAL_PARAMS"
ENV_DATASET = "TIDAL_DATASET"


class ConfigError(ValueError):
    """A runtime setting has a value of the wrong form; the message names the setting."""


def _env_float(name: str, default: float, *, minimum: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected a number, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name}: expected a number >= {minimum}, got {raw!r}")
    return value


def _env_int(name: str, default: int, *, minimum: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name}: expected an integer >= {minimum}, got {raw!r}")
    return value


@dataclass(frozen=True)
class RuntimeConfig:
    """How a worker behaves; read from the environment the launcher sets.

    ``timeout`` bounds every collective and every rendezvous wait: a peer that does not
    answer within it is taken as dead. ``sync_every`` is how often (in steps) the ranks agree
    on whether the membership changes; 1 reacts fastest, larger values cost less per step.
    """

    timeout: float = 10.0
    sync_every: int = 1
    checkpoint_dir: str | None = None
    checkpoint_every_steps: int = 0
    checkpoint_every_seconds: float = 0.0
    backend: str | None = None
    gradient_sync: str = "auto"

    @classmethod
    def from_env(cls) -> RuntimeConfig:
        """Build the config from ``TIDAL_*`` variables; raises :class:`ConfigError`."""
        backend = os.environ.get(ENV_BACKEND) or None
        if backend not in (None, "gloo", "nccl"):
            raise ConfigError(f"{ENV_BACKEND}: expected 'gloo' or 'nccl', got {backend!r}")
        gradient_sync = os.environ.get(ENV_GRADIENT_SYNC) or "auto"
        if gradient_sync not in GRADIENT_SYNC_MODES:
            raise ConfigError(
                f"{ENV_GRADIENT_SYNC}: expected one of {', '.join(GRADIENT_SYNC_MODES)}, "
                f"got {gradient_sync!r}"
            )
        return cls(
            timeout=_env_float(ENV_TIMEOUT, 10.0, minimum=0.1),
            sync_every=_env_int(ENV_SYNC_EVERY, 1, minimum=1),
            checkpoint_dir=os.environ.get(ENV_CHECKPOINT_DIR) or None,
            checkpoint_every_steps=_env_int(ENV_CHECKPOINT_EVERY_STEPS, 0, minimum=0),
            checkpoint_every_seconds=_env_float(ENV_CHECKPOINT_EVERY_SECONDS, 0.0, minimum=0.0),
            backend=backend,
            gradient_sync=gradient_sync,
        )
