"""The environment ``torchrun`` gives each worker, for scripts written against it.

A script launched by ``torchrun`` reads its place in the job from variables the elastic
agent sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` ...) and calls
``init_process_group()`` with ``env://``. :func:`torchrun_env` builds exactly those
variables for one incarnation of a tidal group: every worker of the group, in rank order.

Hosts play the part of torchrun's nodes: the workers on one host are contiguous in rank
order and numbered ``LOCAL_RANK`` 0.. on it; ``GROUP_RANK`` is the host's index. The store
at ``MASTER_ADDR:MASTER_PORT`` is the launcher's (``TORCHELASTIC_USE_AGENT_STORE=True``,
as torchrun's agent does): a new one per incarnation, so no worker ever binds that port.

On GPU slots each worker sees the GPUs of its host's slots, in local-rank order
(``CUDA_VISIBLE_DEVICES``), so ``cuda:LOCAL_RANK`` is its own slot's GPU, as under torchrun
with one process per GPU. A worker given several GPUs (slot ``host:2,3``) is a node of its
own, as a Kubeflow pod with several GPUs is: ``LOCAL_RANK`` 0 of 1, seeing only its GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tidal.launch.slot_names import slot_host, slot_indices

__all__ = ["TorchrunWorld", "torchrun_env"]


@dataclass(frozen=True)
class TorchrunWorld:
    """One incarnation of a torchrun-launched group: what every worker shares."""

    #: ``TORCHELASTIC_RUN_ID``: the job (or ``tidal run``'s run id).
    run_id: str
    #: Where the incarnation's store listens: ``MASTER_ADDR``, ``MASTER_PORT``.
    master_addr: str
    master_port: int
    #: ``TORCHELASTIC_RESTART_COUNT``: restarts of the group so far (a resize is one).
    restart_count: int
    #: ``TORCHELASTIC_MAX_RESTARTS``: the failures the job survives.
    max_restarts: int
    #: ``ROLE_NAME`` (torchrun's ``--role``, ``default`` unless the job names it).
    role: str = "default"
    #: Slots are GPUs: set ``CUDA_VISIBLE_DEVICES`` to the host's slots.
    gpus: bool = False


def _node(slot: str) -> str:
    """The torchrun node a worker on ``slot`` belongs to: its host, or, for a worker of
    several GPUs (``host:2,3``), itself, as a Kubernetes pod given several GPUs is a node
    of its own that sees only those."""
    return slot if len(slot_indices(slot)) > 1 else slot_host(slot)


def torchrun_env(
    slots: Sequence[str], world: TorchrunWorld, inherited: Mapping[str, str]
) -> list[tuple[str, dict[str, str]]]:
    """Every worker of ``world`` on ``slots`` (``host:i``) as ``(slot, variables)``, in rank
    order: the slots of the first host listed, then of the next one, each host's in the
    order given. ``inherited`` is what the workers would see anyway (the launcher's
    environment and the job's own variables): torchrun sets ``OMP_NUM_THREADS=1`` only when
    it is not there and a host runs more than one worker."""
    if len(set(slots)) != len(slots):
        raise ValueError(f"slots: each slot at most once, got {list(slots)}")
    hosts: list[str] = []
    by_host: dict[str, list[str]] = {}
    for slot in slots:
        host = _node(slot)
        if host not in by_host:
            hosts.append(host)
            by_host[host] = []
        by_host[host].append(slot)
    world_size = len(slots)
    out: list[tuple[str, dict[str, str]]] = []
    rank = 0
    for group_rank, host in enumerate(hosts):
        local = by_host[host]
        for local_rank, slot in enumerate(local):
            env = {
                "RANK": str(rank),
                "LOCAL_RANK": str(local_rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_WORLD_SIZE": str(len(local)),
                "GROUP_RANK": str(group_rank),
                "GROUP_WORLD_SIZE": str(len(hosts)),
                # One role per group: its ranks are the global ones.
                "ROLE_RANK": str(rank),
                "ROLE_WORLD_SIZE": str(world_size),
                "ROLE_NAME": world.role,
                "MASTER_ADDR": world.master_addr,
                "MASTER_PORT": str(world.master_port),
                "TORCHELASTIC_RESTART_COUNT": str(world.restart_count),
                "TORCHELASTIC_MAX_RESTARTS": str(world.max_restarts),
                "TORCHELASTIC_RUN_ID": world.run_id,
                "TORCHELASTIC_USE_AGENT_STORE": "True",
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": inherited.get(
                    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"
                ),
            }
            if "OMP_NUM_THREADS" not in inherited and len(local) > 1:
                env["OMP_NUM_THREADS"] = "1"
            if world.gpus:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(i for s in local for i in slot_indices(s))
            out.append((slot, env))
            rank += 1
    return out
