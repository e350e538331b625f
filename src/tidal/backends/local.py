"""The local backend: each job's workers run as subprocesses of a per-job agent.

Agents (:mod:`tidal.launch.agent`) run in their own sessions, so jobs outlive the
controller: after a crash the next :class:`LocalBackend` on the same state folder finds
the live agents again and keeps polling them. Slots ``host:i`` on GPU machines pin worker
``i`` to GPU ``i`` (``CUDA_VISIBLE_DEVICES``).

Starting a job only spawns its agent: :meth:`LocalBackend.start` returns at once and the
agents of many jobs start side by side, while the controller's loop goes on applying
requests. Each :meth:`LocalBackend.poll` looks whether a starting agent serves its store
yet (connecting then) and reports its slots held meanwhile
(:attr:`~tidal.launch.api.JobStatus.starting_slots`). What the controller asks of a job
whose agent is still starting (new slots, a stop) is carried out as soon as it serves.

With ``standby_workers`` above 0 a standby agent is kept started ahead
(:mod:`tidal.backends.local_standby`): a job's first start hands it the job instead of
spawning an agent, so the agent's imports and its first workers' are paid already.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from tidal.backends.base import LOCAL
from tidal.backends.local_agents import (
    AgentBoot,
    AgentHandle,
    agent_alive,
    agent_reports,
    let_go,
    read_status,
    unreported,
)
from tidal.backends.local_reattach import ended_jobs, live_agents
from tidal.backends.local_standby import Standby
from tidal.launch.agent import (
    ENV_AGENT_TREE,
    KEY_STOP,
    AgentStatus,
    final_path,
    record_path,
    write_order,
)
from tidal.launch.agent_config import AgentConfig
from tidal.launch.api import (
    JobLaunch,
    JobStatus,
    MetricPoint,
    WorkerState,
    worker_logs,
)
from tidal.launch.file_modes import user_umask
from tidal.launch.process import kill_marked
from tidal.launch.slot_names import format_slot, parse_slots
from tidal.policy.api import Slot
from tidal.runtime.rendezvous import connect_store

log = logging.getLogger("tidal.backends.local")

#: How long an agent may take to serve its store before it is taken for a failed start
#: (nothing waits on it: it only bounds how long a hung agent holds its slots).
_START_TIMEOUT = 120.0
#: Tries to start a job's new agent after its agent died, before giving up on the restart.
_AGENT_STARTS = 3


class LocalBackend:
    """Runs every job's workers on this machine; see the module docstring."""

    #: Everything :data:`~tidal.backends.base.LOCAL` lists; its workers see this
    #: host's files, so submission checks a spec's working dir and script.
    capabilities = replace(LOCAL, shared_files=True)

    def __init__(
        self,
        data_dir: Path,
        *,
        gpus: bool = False,
        timeout: float = 10.0,
        standby_workers: int = 0,
    ) -> None:
        """Keep the agents' files under ``data_dir/agents``; ``standby_workers``: the warm
        interpreters of the standby agent kept for the next job (0: none)."""
        #: One record, config, log and final status per job's agent.
        self.state_dir = Path(data_dir) / "agents"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.gpus = gpus
        self.timeout = timeout
        self._agents: dict[str, AgentHandle] = {}
        self._log_dirs: dict[str, Path] = {}
        #: Jobs whose agent ended (succeeded or failed) while no backend watched it:
        #: reported once, by the first poll, so the controller records how they ended.
        self._ended: dict[str, JobStatus] = {}
        self._standby = Standby(self.state_dir, standby_workers)
        self._reattach()
        self._standby.keep(starting=False)

    def _reattach(self) -> None:
        """Take on the agents a previous backend on this folder left running, and the
        jobs that ended while none watched (reported by the first poll)."""
        for agent in live_agents(self.state_dir):
            self._agents[agent.job_id] = agent
            if agent.log_dir is not None:
                self._log_dirs[agent.job_id] = agent.log_dir
        self._ended.update(ended_jobs(self.state_dir, self._agents))

    @property
    def job_ids(self) -> list[str]:
        """Jobs this backend currently runs (including re-attached ones)."""
        return sorted(self._agents)

    def start(self, launch: JobLaunch, slots: Sequence[Slot]) -> None:
        """Spawn the job's agent, which starts one worker per worker's slots; returns
        without waiting for it (see the module docstring)."""
        if launch.job_id in self._agents and not self._agents[launch.job_id].stopped:
            self.assign(launch.job_id, slots)
            return
        final_path(self.state_dir, launch.job_id).unlink(missing_ok=True)
        config = AgentConfig(
            # Workers are pinned to their GPUs only where this machine's slots are GPUs.
            launch=replace(launch, gpu=self.gpus and launch.gpu),
            slots=[format_slot(s) for s in slots],
            timeout=self.timeout,
        )
        boot = AgentBoot(config, time.monotonic() + _START_TIMEOUT, retries=0, first=True)
        self._spawn_agent(boot, launch.log_dir, standby=True)
        self._standby.learn(launch.argv, launch.working_dir)

    def _spawn_agent(
        self, boot: AgentBoot, log_dir: Path | None, *, standby: bool = False
    ) -> AgentHandle:
        """Spawn an agent for ``boot.config`` (or, with ``standby``, hand the job to the
        standby agent if one runs); :meth:`poll` connects once it serves."""
        config = boot.config
        config_path = self.state_dir / f"{config.job_id}.launch.json"
        config_path.write_text(config.to_json())
        agent = AgentHandle(config.job_id, 0, None, log_dir, boot=boot)
        handed = self._standby.hand(config.job_id, config_path) if standby else None
        if handed is None:
            self._spawn_process(agent)
        else:
            # A killed agent leaves its record: the standby's must not be taken for it.
            record_path(self.state_dir, agent.job_id).unlink(missing_ok=True)
            agent.pid, agent.process, agent.tree = handed.process.pid, handed.process, handed.tree
            # A standby that dies before serving: the job's agent is spawned instead.
            boot.retries = max(boot.retries, 1)
        self._agents[config.job_id] = agent
        if log_dir is not None:
            self._log_dirs[config.job_id] = log_dir
        return agent

    def _spawn_process(self, agent: AgentHandle) -> None:
        """Start ``agent``'s process (again, for a start that died before serving)."""
        config_path = self.state_dir / f"{agent.job_id}.launch.json"
        agent_log = self.state_dir / f"{agent.job_id}.agent.log"
        tree = f"{agent.job_id}-{secrets.token_hex(8)}"
        # A killed agent leaves its record: the new one's must not be taken for it.
        record_path(self.state_dir, agent.job_id).unlink(missing_ok=True)
        fd = os.open(agent_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with open(fd, "ab") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "tidal.launch.agent", str(config_path), str(self.state_dir)],
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # outlives the controller
                env={**os.environ, ENV_AGENT_TREE: tree},
                umask=user_umask(),  # the agent makes its own files private itself
            )
        agent.pid, agent.process, agent.tree = process.pid, process, tree

    def _restart_agent(self, dead: AgentHandle, slots: Sequence[Slot]) -> None:
        """A new agent for a job whose agent died: the same launch on ``slots``; its
        workers resume from the job's latest checkpoint, numbered after the old ones."""
        config_path = self.state_dir / f"{dead.job_id}.launch.json"
        config = AgentConfig.from_json(config_path.read_text())
        known = [w.worker_id for w in dead.died.workers] if dead.died else []
        config.slots = [format_slot(s) for s in slots]
        config.first_worker_id = max([config.first_worker_id - 1, *known]) + 1
        final_path(self.state_dir, dead.job_id).unlink(missing_ok=True)
        log.warning("job=%s: starting a new agent on %d slot(s)", dead.job_id, len(slots))
        deadline = time.monotonic() + _START_TIMEOUT
        self._spawn_agent(AgentBoot(config, deadline, _AGENT_STARTS - 1, first=False), dead.log_dir)

    def _advance_boot(self, agent: AgentHandle) -> JobStatus | None:
        """One look at a starting agent, never waiting for it: connect once it serves
        (and send what was asked meanwhile), start it again or give it up if it died or
        hangs. Returns what to report while it still starts (its slots held), or a
        failed start; ``None`` once it serves or is over (the usual poll takes over)."""
        boot = agent.boot
        assert boot is not None and agent.process is not None
        record = record_path(self.state_dir, agent.job_id)
        final = final_path(self.state_dir, agent.job_id)
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
                self._landed(agent, boot)
                return None
        if final.exists():
            # Its workers ended at once: the agent wrote its final status, removed its
            # record (and may have exited) before this looked; a job started and over.
            agent.boot = None
            return None
        if code is None and time.monotonic() < boot.deadline:
            return JobStatus(agent.job_id, -1, starting_slots=self._slots(boot))
        if code is None:
            why = f"did not serve within {_START_TIMEOUT:.0f} s"
            agent.process.kill()
            agent.process.wait(timeout=10)
        else:
            why = f"exited with status {code}"
        if final.exists():  # written just before it exited
            agent.boot = None
            return None
        self._kill_tree(agent)
        where = self.state_dir / f"{agent.job_id}.agent.log"
        log.warning("job=%s: the agent %s before serving; see %s", agent.job_id, why, where)
        if boot.retries > 0 and not agent.stopped:
            boot.retries -= 1
            boot.deadline = time.monotonic() + _START_TIMEOUT
            self._spawn_process(agent)
            return JobStatus(agent.job_id, -1, starting_slots=self._slots(boot))
        agent.boot = None
        if boot.first or agent.stopped:
            del self._agents[agent.job_id]
            reason = f"the job's agent {why} before it started; see {where}"
            return JobStatus(agent.job_id, -1, failed=not agent.stopped, reason=reason)
        return None  # a restart that never served: the agent died (see poll)

    @staticmethod
    def _slots(boot: AgentBoot) -> tuple[Slot, ...]:
        """The slots a starting agent holds: those it was started on, and any assigned
        since (until it serves, either may be what its workers come up on)."""
        names = [*boot.config.slots, *(boot.order or ())]
        return tuple(dict.fromkeys(s for name in names for s in parse_slots(name)))

    def _landed(self, agent: AgentHandle, boot: AgentBoot) -> None:
        """The agent serves its store: carry out what was asked while it started."""
        if agent.store is None:
            return
        with contextlib.suppress(Exception):  # an agent that just ended: poll reports it
            if agent.stopped:
                agent.store.set(KEY_STOP, "1")
            elif boot.order is not None:
                agent.assign_seq += 1
                write_order(agent.store, boot.order, agent.assign_seq)

    def assign(self, job_id: str, slots: Sequence[Slot]) -> None:
        """Set the job's slots (applied at its next step boundary)."""
        agent = self._agents[job_id]
        if agent.died is not None:
            self._restart_agent(agent, slots)
            return
        if agent.boot is not None:
            agent.boot.order = [format_slot(s) for s in slots]  # sent once it serves
            return
        if agent.store is None:
            return
        agent.assign_seq += 1
        with contextlib.suppress(Exception):  # an agent that just ended: poll reports it
            write_order(agent.store, [format_slot(s) for s in slots], agent.assign_seq)

    def stop(self, job_id: str) -> None:
        """Release the job's workers (rank 0 checkpoints) and end its agent."""
        agent = self._agents.get(job_id)
        if agent is None or agent.stopped:
            return
        agent.stopped = True  # a starting agent is told once it serves (_landed)
        if agent.died is not None:
            kill_marked(agent.tree, variable=ENV_AGENT_TREE)
            del self._agents[job_id]
            return
        if agent.store is not None:
            with contextlib.suppress(Exception):
                agent.store.set(KEY_STOP, "1")

    def poll(self) -> Mapping[str, JobStatus]:
        """Every job's workers as their agents last reported them."""
        statuses: dict[str, JobStatus] = {}
        reports: dict[str, tuple[tuple[MetricPoint, ...], dict[str, Any] | None]] = {}
        statuses.update(self._ended)
        self._ended.clear()
        for job_id, agent in list(self._agents.items()):
            if agent.died is not None:
                statuses[job_id] = agent.died
                continue
            if agent.boot is not None:
                starting = self._advance_boot(agent)
                if starting is not None:
                    statuses[job_id] = starting
                    continue
            alive = agent_alive(agent)
            if not alive:
                # Nothing serves its store any more: a call would only fail (and torch
                # logs each such failure as a warning of many lines).
                agent.store, agent.reports = None, None
            # Reports first: reading the final status lets go of the agent's store.
            reports[job_id] = agent_reports(agent)
            status = read_status(agent, self.state_dir)
            if status is not None:
                agent.last = status
            if agent.last is None:
                if not alive:
                    unstarted = unreported(self.state_dir, job_id)
                    if unstarted is not None:
                        statuses[job_id] = self._on_agent_death(agent, unstarted)
                        continue
                    self._kill_tree(agent)
                    statuses[job_id] = JobStatus(job_id, -1, failed=True, reason="agent died")
                    del self._agents[job_id]
                continue
            statuses[job_id] = agent.last.job_status()
            if not alive and (agent.last.outcome is not None or agent.stopped):
                del self._agents[job_id]
            elif not alive:
                final = final_path(self.state_dir, job_id)
                if final.exists():
                    statuses[job_id] = AgentStatus.from_json(final.read_text()).job_status()
                else:
                    statuses[job_id] = self._on_agent_death(agent, agent.last)
                    continue
                del self._agents[job_id]
        for job_id, (metrics, goodput) in reports.items():
            if job_id in statuses:
                statuses[job_id] = replace(statuses[job_id], metrics=metrics, goodput=goodput)
        self._keep_standby(statuses)
        return statuses

    def _keep_standby(self, statuses: Mapping[str, JobStatus]) -> None:
        """Replace the standby once no job starts: none of their agents booting, and the
        job that took the last standby training (or over)."""
        taken = self._standby.taken_by
        status = statuses.get(taken) if taken is not None else None
        if taken not in self._agents or (
            status is not None
            and (
                status.finished
                or status.failed
                or any(w.state is WorkerState.RUNNING for w in status.workers)
            )
        ):
            self._standby.taken_by = None
        booting = any(a.boot is not None for a in self._agents.values())
        self._standby.keep(starting=booting or self._standby.taken_by is not None)

    def _kill_tree(self, agent: AgentHandle) -> None:
        if agent.tree:
            killed = kill_marked(agent.tree, variable=ENV_AGENT_TREE)
            if killed:
                log.warning("job=%s: killed %d process(es) its agent left", agent.job_id, killed)

    def _on_agent_death(self, agent: AgentHandle, last: AgentStatus) -> JobStatus:
        """The agent died mid-job: kill what it left (its workers lost their store) and
        report them failed, so the controller's restart decision counts one restart or
        fails the job; a restart reaches :meth:`assign`, which starts a new agent."""
        self._kill_tree(agent)
        agent.store, agent.reports = None, None
        live = (WorkerState.STARTING, WorkerState.RUNNING)
        status = last.job_status()
        workers = tuple(
            replace(w, state=WorkerState.FAILED) if w.state in live else w for w in status.workers
        )
        log.warning("job=%s: agent pid %d died", agent.job_id, agent.pid)
        agent.died = replace(status, workers=workers, reason="agent died")
        return agent.died

    def log_paths(self, job_id: str) -> Mapping[int, Path]:
        """Each worker's log file by worker id."""
        return worker_logs(self._log_dirs.get(job_id))

    def close(self, grace: float = 30.0) -> None:
        """Stop every job (workers checkpoint and leave) and wait for the agents to end."""
        self._standby.close()
        for job_id in list(self._agents):
            self.stop(job_id)
        deadline = time.monotonic() + grace
        for agent in list(self._agents.values()):
            while agent_alive(agent) and time.monotonic() < deadline:
                if agent.boot is not None:
                    self._advance_boot(agent)  # told to stop once it serves
                elif final_path(self.state_dir, agent.job_id).exists():
                    let_go(agent)  # it waits for that before it exits
                time.sleep(0.02)
            if agent_alive(agent):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(agent.pid, signal.SIGKILL)
            if agent.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    agent.process.wait(timeout=5)
        self._agents.clear()
