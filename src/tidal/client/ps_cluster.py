"""The job spec of a parameter-server cluster, as :meth:`tidal.client.Client.run_cluster`
submits it: a ``ps`` role of ``n_ps`` fixed replicas and a ``worker`` role of
``n_workers``, both started by the ``ps`` launcher and running the same script, with the
training's configuration (:class:`~tidal.ps.config.PSConfig`) in every process's
environment. The job succeeds when every worker exited 0; the servers are then stopped.
With ``chief=True`` a ``chief`` role of one replica runs the same script as the job's
observer (it evaluates and checkpoints) and the job succeeds on the chief's success
instead (Kubeflow's successPolicy), so the chief waits for the workers to finish.

Light to import (no torch, no ZeroMQ): the SDK builds the spec on the user's side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tidal.client.workers import WorkerArgumentError, launch_spec
from tidal.ps.config import Mode, PSConfig

__all__ = ["CHIEF_ROLE", "PS_ROLE", "WORKER_ROLE", "cluster_job_spec"]

PS_ROLE = "ps"
WORKER_ROLE = "worker"
CHIEF_ROLE = "chief"


def cluster_job_spec(
    n_workers: int,
    n_ps: int,
    *,
    worker_script: str,
    cpu: float = 1.0,
    memory: int | str | None = None,
    gpus: int = 0,
    mode: Mode = "async",
    replicas_to_aggregate: int | None = None,
    max_staleness: int | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    name: str = "ps",
    chief: bool = False,
) -> dict[str, Any]:
    """The spec of a ``ps`` + ``worker`` job; :class:`WorkerArgumentError` names a bad
    argument (``n_ps: a parameter-server job needs at least 1 server, got 0``)."""
    if (
        not isinstance(args, Sequence)
        or isinstance(args, str)
        or not all(isinstance(a, str) for a in args)
    ):
        raise WorkerArgumentError(f"args: expected a list of strings, got {args!r}")
    if isinstance(worker_script, str) and worker_script.strip():
        command = ["python", worker_script, *args]
    else:
        raise WorkerArgumentError(
            f"worker_script: expected a path to a Python file, got {worker_script!r}"
        )
    # Each role is checked as a launch of its own: n_workers and n_ps are the counts.
    workers = _role(n_workers, "n_workers", command, cpu, memory, gpus, env, WORKER_ROLE, name)
    if isinstance(n_ps, bool) or not isinstance(n_ps, int) or n_ps < 1:
        raise WorkerArgumentError(
            f"n_ps: a parameter-server job needs at least 1 server, got {n_ps!r}"
        )
    servers = _role(n_ps, "n_ps", command, cpu, memory, 0, env, PS_ROLE, name)
    config = PSConfig(
        n_ps=n_ps,
        mode=mode,
        replicas_to_aggregate=replicas_to_aggregate,
        max_workers=n_workers,
        max_staleness=max_staleness,
    )
    try:
        config.validate()
    except ValueError as exc:
        raise WorkerArgumentError(str(exc)) from None
    except TypeError:
        raise WorkerArgumentError(
            "replicas_to_aggregate/max_staleness: expected integers or None"
        ) from None
    if not isinstance(chief, bool):
        raise WorkerArgumentError(f"chief: expected true or false, got {chief!r}")
    roles = [
        {**servers, "launcher": "ps", "ends_job": False},
        {**workers, "launcher": "ps", "ends_job": not chief},
    ]
    if chief:
        lead = _role(1, "chief", command, cpu, memory, gpus, env, CHIEF_ROLE, name)
        roles.append({**lead, "launcher": "ps", "ends_job": True})
    return {"name": name, "env": config.to_env(), "roles": roles}


def _role(
    n: int,
    argument: str,
    command: list[str],
    cpu: float,
    memory: int | str | None,
    gpus: int,
    env: Mapping[str, str] | None,
    role: str,
    name: str,
) -> dict[str, Any]:
    """One role's entry, checked as :func:`tidal.client.workers.launch_spec` checks a launch."""
    try:
        spec = launch_spec(
            n, cpu=cpu, memory=memory, gpus=gpus, command=command, env=env, role=role, name=name
        )
    except WorkerArgumentError as exc:
        text = str(exc)
        if text.startswith("n:"):
            text = argument + text[1:]
        raise WorkerArgumentError(text) from None
    entry: dict[str, Any] = spec["roles"][0] if "roles" in spec else _as_role(spec, role)
    return entry


def _as_role(spec: Mapping[str, Any], role: str) -> dict[str, Any]:
    return {
        "name": role,
        "command": spec["command"],
        "replicas": spec["workers"],
        "resources": spec["resources"],
        "env": spec["env"],
    }
