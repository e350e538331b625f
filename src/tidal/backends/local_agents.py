"""What the local backend knows of one job's agent process, and whether it still runs.

:class:`AgentHandle` is the backend's record of an agent it started or re-attached to;
:class:`AgentBoot` what it keeps of one it spawned that does not serve its store yet.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from tidal.launch.agent import AgentStatus, read_order
from tidal.launch.agent_config import AgentConfig
from tidal.launch.api import JobStatus
from tidal.runtime.rendezvous import ReportQueue

__all__ = ["AgentBoot", "AgentHandle", "agent_alive", "process_alive", "written_seq"]


@dataclass
class AgentBoot:
    """An agent spawned and not serving its store yet."""

    config: AgentConfig
    #: When (monotonic) it is taken for a failed start.
    deadline: float
    #: Starts left if this one dies first (a restart tries more than once).
    retries: int
    #: A job's first start: an agent that never serves fails the job. A restart's is an
    #: agent death like any other (the controller's restart decision counts it).
    first: bool
    #: Slots assigned while it started: ordered once it serves.
    order: list[str] | None = None


@dataclass
class AgentHandle:
    """One job's agent as the backend tracks it."""

    job_id: str
    pid: int
    store: dist.Store | None
    log_dir: Path | None
    process: subprocess.Popen[bytes] | None = None
    assign_seq: int = 0
    stopped: bool = False
    last: AgentStatus | None = None
    reports: ReportQueue | None = field(default=None, repr=False)
    #: The agent's :data:`ENV_AGENT_TREE` token: every process of the job carries it.
    tree: str = ""
    #: It died without ending its job: what it left was killed, the job's workers are
    #: reported failed, and the next ``assign`` starts a new agent (a restart).
    died: JobStatus | None = None
    #: Spawned and not serving yet (:meth:`LocalBackend.poll` connects once it does).
    boot: AgentBoot | None = None


def written_seq(store: dist.Store) -> int:
    """The number of the last assignment written to the agent's store (0 if none)."""
    try:
        order = read_order(store)
    except (RuntimeError, ValueError, KeyError, TypeError):
        return 0  # unreadable: the agent's own report stands
    return 0 if order is None else order[0]


def agent_alive(agent: AgentHandle) -> bool:
    """Whether the agent's process runs (our child: polled; re-attached: looked up)."""
    if agent.process is not None:
        return agent.process.poll() is None
    return process_alive(agent.pid)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A re-attached agent is not our child: a zombie cannot be reaped here, so look at it.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True
