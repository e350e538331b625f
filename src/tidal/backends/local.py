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
whose agent is still starting (new slots, a stop) is carried out as soon as it serves
(:mod:`tidal.backends.local_boot`).

With ``standby_workers`` above 0 a standby agent is kept started ahead
(:mod:`tidal.backends.local_standby`): a job's first start hands it the job instead of
spawning an agent, so the agent's imports and its first workers' are paid already.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
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
from tidal.backends.local_boot import (
    AGENT_STARTS,
    START_TIMEOUT,
    advance_boot,
    kill_tree,
    spawn_agent_process,
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
from tidal.launch.process import kill_marked
from tidal.launch.script_imports import script_imports
from tidal.launch.slot_names import format_slot
from tidal.policy.api import Slot

log = logging.getLogger("tidal.backends.local")


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
        # Read once, here: the agent's warm interpreters and the next standby's import it.
        preload = script_imports(launch.argv, launch.working_dir)
        config = AgentConfig(
            # Workers are pinned to their GPUs only where this machine's slots are GPUs.
            launch=replace(launch, gpu=self.gpus and launch.gpu),
            slots=[format_slot(s) for s in slots],
            timeout=self.timeout,
            preload=preload,
        )
        boot = AgentBoot(config, time.monotonic() + START_TIMEOUT, retries=0, first=True)
        self._spawn_agent(boot, launch.log_dir, standby=True)
        self._standby.learn(preload)

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
            spawn_agent_process(self.state_dir, agent)
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
        deadline = time.monotonic() + START_TIMEOUT
        self._spawn_agent(AgentBoot(config, deadline, AGENT_STARTS - 1, first=False), dead.log_dir)

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
                starting = advance_boot(self.state_dir, agent)
                if starting is not None:
                    if agent.boot is None:  # a start given up on
                        del self._agents[job_id]
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
                    kill_tree(agent)
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

    def _on_agent_death(self, agent: AgentHandle, last: AgentStatus) -> JobStatus:
        """The agent died mid-job: kill what it left (its workers lost their store) and
        report them failed, so the controller's restart decision counts one restart or
        fails the job; a restart reaches :meth:`assign`, which starts a new agent."""
        kill_tree(agent)
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
                    advance_boot(self.state_dir, agent)  # told to stop once it serves
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
