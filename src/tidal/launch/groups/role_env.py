"""The environment each launcher gives a role's replicas, as pure functions.

``tf``   ``TF_CONFIG`` exactly as Kubeflow's TFJob operator writes it: every replica of
         every role at ``host:port`` (the evaluator is no part of the training cluster),
         this replica's ``{type, index}``, ``"environment": "cloud"``.
``ps``   the environment contract of :mod:`tidal.ps.env` (``TIDAL_PS_ROLE``, ``_INDEX``,
         ``_WORKER_ID``, ``_N_PS``, ``_ADDRESS_DIR``, ``_MAX_WORKERS``, ...).
``mpi``  a hostfile of the other roles' slots (one line per host, ``host slots=N``), its
         path in ``TIDAL_HOSTFILE`` and ``OMPI_MCA_orte_default_hostfile``, and the same
         list as ``TIDAL_HOSTS`` (``h1:2,h2:1``, horovodrun's ``-H``).

Every replica of a multi-role job also gets ``TIDAL_ROLE`` and ``TIDAL_REPLICA_INDEX``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from tidal.launch.slot_names import slot_host
from tidal.ps.env import (
    ENV_ADDRESS_DIR,
    ENV_CHECKPOINT_DIR,
    ENV_INDEX,
    ENV_MAX_WORKERS,
    ENV_N_PS,
    ENV_WORKER_ID,
)
from tidal.ps.env import ENV_ROLE as ENV_PS_ROLE

__all__ = [
    "CHIEF_ROLE",
    "ENV_HOSTFILE",
    "ENV_HOSTS",
    "ENV_REPLICA_INDEX",
    "ENV_ROLE",
    "PS_ROLE",
    "hostfile_text",
    "hosts_text",
    "mpi_env",
    "ps_env",
    "tf_cluster",
    "tf_config",
]

ENV_ROLE = "TIDAL_ROLE"
ENV_REPLICA_INDEX = "TIDAL_REPLICA_INDEX"
ENV_HOSTFILE = "TIDAL_HOSTFILE"
ENV_HOSTS = "TIDAL_HOSTS"
#: The role of a ``ps``-launched job whose replicas serve the parameters.
PS_ROLE = "ps"
#: The role of a ``ps``-launched job that evaluates and checkpoints (one replica; it
#: reads the parameters and is never counted as a worker).
CHIEF_ROLE = "chief"
#: TFJob leaves its evaluator out of the cluster spec: it only reads checkpoints.
_NOT_IN_TF_CLUSTER = frozenset({"evaluator"})


def tf_cluster(addresses: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """The ``cluster`` of ``TF_CONFIG``: each role's replica addresses, by index."""
    return {
        role: list(addrs)
        for role, addrs in sorted(addresses.items())
        if role not in _NOT_IN_TF_CLUSTER and addrs
    }


def tf_config(addresses: Mapping[str, Sequence[str]], task_type: str, index: int) -> str:
    """``TF_CONFIG`` for replica ``index`` of role ``task_type``, as the TFJob operator
    marshals it (keys of ``cluster`` sorted, no spaces)."""
    value = {
        "cluster": tf_cluster(addresses),
        "task": {"type": task_type, "index": index},
        "environment": "cloud",
    }
    return json.dumps(value, separators=(",", ":"))


def ps_env(
    role: str,
    index: int,
    *,
    n_ps: int,
    max_workers: int,
    address_dir: str,
    checkpoint_dir: str | None = None,
) -> dict[str, str]:
    """The :mod:`tidal.ps.env` contract for replica ``index`` of ``role``: the ``ps``
    role serves shard ``index``; the ``chief`` role is the job's observer (id ``chief``);
    any other role is a worker reading data stream ``index`` under the stable id
    ``worker-<index>`` (a replacement resumes its data position)."""
    is_ps = role == PS_ROLE
    kind = "ps" if is_ps else "chief" if role == CHIEF_ROLE else "worker"
    env = {
        ENV_PS_ROLE: kind,
        ENV_INDEX: str(index),
        ENV_N_PS: str(n_ps),
        ENV_MAX_WORKERS: str(max_workers),
        ENV_ADDRESS_DIR: address_dir,
    }
    if not is_ps:
        names = {"chief": "chief", "worker": f"worker-{index}"}
        env[ENV_WORKER_ID] = names.get(role, f"{role}-{index}")
    if checkpoint_dir:
        env[ENV_CHECKPOINT_DIR] = checkpoint_dir
    return env


def _per_host(slots: Sequence[str]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for slot in slots:
        host = slot_host(slot)
        counts[host] = counts.get(host, 0) + 1
    return list(counts.items())


def hostfile_text(slots: Sequence[str]) -> str:
    """An MPI hostfile for ``slots`` (``host:i`` names): ``host slots=N`` per host."""
    return "".join(f"{host} slots={n}\n" for host, n in _per_host(slots))


def hosts_text(slots: Sequence[str]) -> str:
    """``slots`` as horovodrun's ``-H``: ``h1:2,h2:1``."""
    return ",".join(f"{host}:{n}" for host, n in _per_host(slots))


def mpi_env(hostfile: str, slots: Sequence[str]) -> dict[str, str]:
    """What a launcher role gets: the hostfile's path (ours and Open MPI's variable) and
    the host list."""
    return {
        ENV_HOSTFILE: hostfile,
        "OMPI_MCA_orte_default_hostfile": hostfile,
        ENV_HOSTS: hosts_text(slots),
    }
