"""What the local backend knows of one job's agent process, whether it still runs, and
what it reads of it (status, reports) through the job's store.

:class:`AgentHandle` is the backend's record of an agent it started or re-attached to;
:class:`AgentBoot` what it keeps of one it spawned that does not serve its store yet.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist

from tidal.launch.agent import (
    KEY_BYE,
    KEY_FINAL,
    KEY_REPORTS,
    KEY_STATUS,
    AgentStatus,
    AgentWorker,
    final_path,
    read_order,
)
from tidal.launch.agent_config import AgentConfig
from tidal.launch.api import JobStatus, MetricPoint, WorkerState, read_reports
from tidal.runtime.rendezvous import ReportQueue

__all__ = [
    "AgentBoot",
    "AgentHandle",
    "agent_alive",
    "agent_reports",
    "let_go",
    "process_alive",
    "read_status",
    "unreported",
    "written_seq",
]

log = logging.getLogger("tidal.backends.local")


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


def agent_reports(agent: AgentHandle) -> tuple[tuple[MetricPoint, ...], dict[str, Any] | None]:
    """Metrics and the newest goodput report the agent passed on since the last poll."""
    if agent.store is None:
        return (), None
    if agent.reports is None:
        agent.reports = ReportQueue(agent.store, KEY_REPORTS)
    try:
        raw = agent.reports.drain()
    except Exception:  # the agent (and its store) is gone; poll notices
        return (), None
    batches = []
    for text in raw:
        try:
            batches.append(json.loads(text))
        except ValueError:
            log.debug("job=%s: malformed report skipped", agent.job_id)
    return read_reports(batches)


def read_status(agent: AgentHandle, state_dir: Path) -> AgentStatus | None:
    """The agent's status now: its final one once over, else its last published."""
    final = final_path(state_dir, agent.job_id)
    if final.exists():
        let_go(agent)
        return AgentStatus.from_json(final.read_text())
    if agent.store is None:
        return None
    try:
        if agent.store.check([KEY_STATUS]):
            status = AgentStatus.from_json(agent.store.get(KEY_STATUS))
            if status.outcome is not None and agent.store.check([KEY_FINAL]):
                # Over, and its final file not written (a full disk): the same
                # status from the store; the agent waits to be let go of.
                status = AgentStatus.from_json(agent.store.get(KEY_FINAL))
                let_go(agent)
            return status
    except Exception:  # the agent (and its store) is gone
        agent.store = None
    return None


def let_go(agent: AgentHandle) -> None:
    """The agent ended: drop its store, then tell it so (:data:`KEY_BYE`), in that
    order, so no call reaches its store after it closed (each such call logs a
    multi-line warning of torch's)."""
    store, agent.store, agent.reports = agent.store, None, None
    if store is not None:
        with contextlib.suppress(Exception):  # gone already (its wait timed out)
            store.set(KEY_BYE, "1")
    elif agent.process is not None and agent.process.poll() is None:
        # Over before this backend ever reached its store (a job that ended while its
        # agent was starting): no bye can be sent, and the agent would wait for one.
        agent.process.kill()
        agent.process.wait(timeout=10)


def unreported(state_dir: Path, job_id: str) -> AgentStatus | None:
    """An agent that died before its first status: the workers it was to start, as it
    numbers them (one per slot, from ``first_worker_id``), still starting."""
    try:
        config = AgentConfig.from_json((state_dir / f"{job_id}.launch.json").read_text())
    except (OSError, ValueError, TypeError):
        return None
    workers = [
        AgentWorker(config.first_worker_id + i, slot, WorkerState.STARTING.value, None, None)
        for i, slot in enumerate(config.slots)
    ]
    return AgentStatus(job_id, -1, workers)
