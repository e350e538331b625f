"""A local job's agent as it starts: its process spawned, looked at by each poll until it
serves its store, started again if it died before serving, given up on if it hangs.

Nothing here waits for an agent: :class:`~tidal.backends.local.LocalBackend` starts the
agents of many jobs side by side and each poll takes one look at each (:func:`advance_boot`).
What the controller asked of a job while its agent started (new slots, a stop) is sent once
it serves (:func:`landed`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from tidal.backends.local_agents import AgentBoot, AgentHandle
from tidal.launch.agent import ENV_AGENT_TREE, KEY_STOP, final_path, record_path, write_order
from tidal.launch.api import JobStatus
from tidal.launch.file_modes import user_umask
from tidal.launch.process import kill_marked
from tidal.launch.slot_names import parse_slots
from tidal.policy.api import Slot
from tidal.runtime.rendezvous import connect_store

__all__ = [
    "AGENT_STARTS",
    "START_TIMEOUT",
    "advance_boot",
    "boot_slots",
    "kill_tree",
    "landed",
    "spawn_agent_process",
]

log = logging.getLogger("tidal.backends.local")

#: How long an agent may take to serve its store before it is taken for a failed start
#: (nothing waits on it: it only bounds how long a hung agent holds its slots).
START_TIMEOUT = 120.0
#: Tries to start a job's new agent after its agent died, before giving up on the restart.
AGENT_STARTS = 3


def spawn_agent_process(state_dir: Path, agent: AgentHandle) -> None:
    """Start ``agent``'s process (again, for a start that died before serving)."""
    config_path = state_dir / f"{agent.job_id}.launch.json"
    agent_log = state_dir / f"{agent.job_id}.agent.log"
    tree = f"{agent.job_id}-{secrets.token_hex(8)}"
    # A killed agent leaves its record: the new one's must not be taken for it.
    record_path(state_dir, agent.job_id).unlink(missing_ok=True)
    fd = os.open(agent_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with open(fd, "ab") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "tidal.launch.agent", str(config_path), str(state_dir)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives the controller
            env={**os.environ, ENV_AGENT_TREE: tree},
            umask=user_umask(),  # the agent makes its own files private itself
        )
    agent.pid, agent.process, agent.tree = process.pid, process, tree


def advance_boot(state_dir: Path, agent: AgentHandle) -> JobStatus | None:
    """One look at a starting agent, never waiting for it: connect once it serves
    (and send what was asked meanwhile), start it again or give it up if it died or
    hangs. Returns what to report while it still starts (its slots held), or a
    failed start (its boot over: the backend forgets the job); ``None`` once it serves or
    is over (the usual poll takes over)."""
    boot = agent.boot
    assert boot is not None and agent.process is not None
    record = record_path(state_dir, agent.job_id)
    final = final_path(state_dir, agent.job_id)
    code = agent.process.poll()
    try:
        # An agent that exited left a record only if it was killed: nothing to reach.
        text = record.read_text() if code is None else None
    except FileNotFoundError:
        text = None
    if text is not None:
        host, _, port = str(json.loads(text)["store"]).rpartition(":")
        try:
            agent.store = connect_store(host, int(port), timeout=10)
        except Exception as exc:
            # Over between the record and the connection (poll reads the final
            # status), or dying: the next look finds its exit.
            log.debug("job=%s: agent store not reached: %s", agent.job_id, exc)
        if agent.store is not None or final.exists():
            agent.boot = None
            landed(agent, boot)
            return None
    if final.exists():
        # Its workers ended at once: the agent wrote its final status, removed its
        # record (and may have exited) before this looked; a job started and over.
        agent.boot = None
        return None
    if code is None and time.monotonic() < boot.deadline:
        return JobStatus(agent.job_id, -1, starting_slots=boot_slots(boot))
    if code is None:
        why = f"did not serve within {START_TIMEOUT:.0f} s"
        agent.process.kill()
        agent.process.wait(timeout=10)
    else:
        why = f"exited with status {code}"
    if final.exists():  # written just before it exited
        agent.boot = None
        return None
    kill_tree(agent)
    where = state_dir / f"{agent.job_id}.agent.log"
    log.warning("job=%s: the agent %s before serving; see %s", agent.job_id, why, where)
    if boot.retries > 0 and not agent.stopped:
        boot.retries -= 1
        boot.deadline = time.monotonic() + START_TIMEOUT
        spawn_agent_process(state_dir, agent)
        return JobStatus(agent.job_id, -1, starting_slots=boot_slots(boot))
    agent.boot = None
    if boot.first or agent.stopped:
        reason = f"the job's agent {why} before it started; see {where}"
        return JobStatus(agent.job_id, -1, failed=not agent.stopped, reason=reason)
    return None  # a restart that never served: the agent died (see poll)


def boot_slots(boot: AgentBoot) -> tuple[Slot, ...]:
    """The slots a starting agent holds: those it was started on, and any assigned
    since (until it serves, either may be what its workers come up on)."""
    names = [*boot.config.slots, *(boot.order or ())]
    return tuple(dict.fromkeys(s for name in names for s in parse_slots(name)))


def landed(agent: AgentHandle, boot: AgentBoot) -> None:
    """The agent serves its store: carry out what was asked while it started."""
    if agent.store is None:
        return
    with contextlib.suppress(Exception):  # an agent that just ended: poll reports it
        if agent.stopped:
            agent.store.set(KEY_STOP, "1")
        elif boot.order is not None:
            agent.assign_seq += 1
            write_order(agent.store, boot.order, agent.assign_seq)


def kill_tree(agent: AgentHandle) -> None:
    """Kill what remains of the agent's process tree (its workers, say)."""
    if agent.tree:
        killed = kill_marked(agent.tree, variable=ENV_AGENT_TREE)
        if killed:
            log.warning("job=%s: killed %d process(es) its agent left", agent.job_id, killed)
