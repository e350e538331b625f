"""What a new local backend finds in its state folder: the agents a previous backend
left running (re-attached: their store reached, their last status read), and the jobs
whose agents ended while no backend watched."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Collection
from pathlib import Path

from tidal.backends.local_agents import AgentHandle, process_alive, written_seq
from tidal.launch.agent import KEY_STATUS, AgentStatus
from tidal.launch.agent_config import AgentConfig
from tidal.launch.api import JobStatus
from tidal.runtime.rendezvous import connect_store

__all__ = ["ended_jobs", "live_agents"]

log = logging.getLogger("tidal.backends.local")


def live_agents(state_dir: Path) -> list[AgentHandle]:
    """The agents whose records are in ``state_dir`` and that still serve their store
    (records of those that do not are removed: their jobs are lost)."""
    found: list[AgentHandle] = []
    for record in sorted(state_dir.glob("*.agent.json")):
        try:
            data = json.loads(record.read_text())
            pid = int(data["pid"])
            os.kill(pid, 0)  # PermissionError: the pid is another user's now
            if not process_alive(pid):
                raise ProcessLookupError
        except (ValueError, KeyError, ProcessLookupError, PermissionError):
            record.unlink(missing_ok=True)
            continue
        job_id = str(data["job_id"])
        launch = state_dir / f"{job_id}.launch.json"
        log_dir = None
        if launch.exists():
            log_dir = AgentConfig.from_json(launch.read_text()).launch.log_dir
        host, _, port = str(data["store"]).rpartition(":")
        try:
            store = connect_store(host, int(port), timeout=10)
        except (RuntimeError, OSError, ValueError) as exc:
            # Its process lives on but serves nothing (killed and not yet reaped, or its
            # pid taken by another): the job is lost, not the server.
            log.warning("job=%s: agent pid=%s unreachable (%s)", job_id, data["pid"], exc)
            record.unlink(missing_ok=True)
            continue
        agent = AgentHandle(
            job_id, int(data["pid"]), store, log_dir, tree=str(data.get("tree", ""))
        )
        if store.check([KEY_STATUS]):
            agent.last = AgentStatus.from_json(store.get(KEY_STATUS))
            agent.assign_seq = agent.last.assign_seq
        # Past the last order written too, not only the last the agent reported: one
        # written just before the previous backend died may be taken after this read,
        # and the agent ignores any order whose number it has already seen.
        agent.assign_seq = max(agent.assign_seq, written_seq(store))
        found.append(agent)
        log.info("re-attached to job=%s agent pid=%d", job_id, agent.pid)
    return found


def ended_jobs(state_dir: Path, running: Collection[str]) -> dict[str, JobStatus]:
    """Agents that ended their job while no backend watched (the controller was
    down): their final status, so the job is recorded as it ended instead of being
    taken for lost and run again. A stopped one is left out: its job was released
    (it resumes from its checkpoint when started again)."""
    found: dict[str, JobStatus] = {}
    for final in sorted(state_dir.glob("*.final.json")):
        try:
            status = AgentStatus.from_json(final.read_text())
            ended = status.job_status()
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue  # unreadable: the job is taken for lost, as before
        if status.job_id in running or status.outcome not in ("succeeded", "failed"):
            continue
        found[status.job_id] = ended
        log.info("job=%s ended (%s) while no controller watched", status.job_id, status.outcome)
    return found
