"""How the local backend tells a job's agent what to run: ``<job>.launch.json``.

The file is the job's :class:`~tidal.launch.api.JobLaunch` (as the backend runs it) and
what only the agent needs: the slots to start on, the workers' timeout and the first
worker's number. The backend writes it when it starts an agent and reads it again after a
restart of the server, to re-attach to the agents still running and to start a new agent
for a job whose agent died. That server may be a newer release than the one that wrote
the file, so :meth:`AgentConfig.from_json` also reads the flat form earlier releases
wrote (the launch's fields side by side with the agent's, ``gpus`` for ``gpu``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from tidal.launch.api import JobLaunch, RoleLaunch

__all__ = ["AgentConfig", "launch_from_json", "launch_to_json"]

_LAUNCH_FIELDS = frozenset(f.name for f in fields(JobLaunch))
_ROLE_FIELDS = frozenset(f.name for f in fields(RoleLaunch))
_PATHS = ("working_dir", "log_dir", "checkpoint_dir")


def launch_to_json(launch: JobLaunch) -> dict[str, Any]:
    """``launch`` as plain JSON values (paths as strings, tuples as lists)."""
    data = asdict(launch)
    for name in _PATHS:
        data[name] = str(data[name]) if data[name] is not None else None
    data["argv"] = list(launch.argv)
    data["env"] = dict(launch.env)
    data["roles"] = [{**asdict(r), "argv": list(r.argv), "env": dict(r.env)} for r in launch.roles]
    return data


def _role_from_json(data: Mapping[str, Any]) -> RoleLaunch:
    known = {k: v for k, v in data.items() if k in _ROLE_FIELDS}
    return RoleLaunch(**{**known, "argv": tuple(data["argv"]), "env": dict(data.get("env", {}))})


def launch_from_json(data: Mapping[str, Any]) -> JobLaunch:
    """The inverse of :func:`launch_to_json`. Fields it does not know are left out (a
    file of a later release); ``ValueError`` when one it needs is missing or malformed."""
    try:
        known = {k: v for k, v in data.items() if k in _LAUNCH_FIELDS}
        for name in _PATHS:
            known[name] = Path(known[name]) if known.get(name) else None
        known["argv"] = tuple(data["argv"])
        known["env"] = dict(data.get("env") or {})
        known["roles"] = tuple(_role_from_json(r) for r in data.get("roles") or ())
        return JobLaunch(**known)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed launch: {type(exc).__name__}: {exc}") from None


#: The flat form's fields that are the agent's own, not the launch's.
_AGENT_FIELDS = ("slots", "timeout", "first_worker_id")


def _launch_of_flat(data: Mapping[str, Any]) -> JobLaunch:
    """The launch in a config of an earlier release: the launch's fields at the top level,
    ``gpus`` for :attr:`JobLaunch.gpu` (already the backend's answer: GPUs here and slots
    that are GPUs), no ``launcher``, ``roles`` or ``replica_slots`` in the oldest."""
    launch = {k: v for k, v in data.items() if k not in _AGENT_FIELDS and k != "gpus"}
    launch["gpu"] = bool(data.get("gpus", False))
    return launch_from_json(launch)


@dataclass
class AgentConfig:
    """How to run the job; written by the backend as ``<job>.launch.json``."""

    #: The job as this backend runs it (:attr:`JobLaunch.gpu`: pin workers to their GPUs).
    launch: JobLaunch
    #: The slots to start on (``host:i`` names).
    slots: list[str]
    #: Bound on collectives and joins inside the workers, in seconds.
    timeout: float = 10.0
    #: The first worker's number (a restarted agent continues after its predecessor's).
    first_worker_id: int = 0
    #: What the job's script imports at its top level, as the backend found it
    #: (:func:`~tidal.launch.script_imports.script_imports`), for the job's warm interpreters to
    #: import ahead; ``None``: the agent reads the script itself.
    preload: list[str] | None = None

    @property
    def job_id(self) -> str:
        """The job's id."""
        return self.launch.job_id

    def to_json(self) -> str:
        """The file's text."""
        return json.dumps(
            {
                "launch": launch_to_json(self.launch),
                "slots": list(self.slots),
                "timeout": self.timeout,
                "first_worker_id": self.first_worker_id,
                "preload": self.preload,
            }
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> AgentConfig:
        """Read the file, in this release's form or the flat one of earlier releases;
        ``ValueError`` when it is not a config."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("a launch config is a JSON object")
        flat = "launch" not in data
        try:
            return cls(
                launch=_launch_of_flat(data) if flat else launch_from_json(data["launch"]),
                slots=[str(s) for s in data["slots"]],
                timeout=float(data.get("timeout", 10.0)),
                first_worker_id=int(data.get("first_worker_id", 0)),
                preload=_preload(data.get("preload")),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed launch config: {type(exc).__name__}: {exc}") from None


def _preload(value: object) -> list[str] | None:
    """The config's ``preload``: a list of module names, or absent (``None``)."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise TypeError(f"preload: expected a list of module names, got {value!r}")
    return list(value)
