"""The local backend: each job's workers run as subprocesses of a per-job agent.

Agents (:mod:`tidal.launch.agent`) run in their own sessions, so jobs outlive the
controller: after a crash the next :class:`LocalBackend` on the same state folder finds
the live agents again and keeps polling them. Slots ``host:i`` on GPU machines pin worker
``i`` to GPU ``i`` (``CUDA_VISIBLE_DEVICES``).
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch.distributed as dist

from tidal.backends.base import LOCAL
from tidal.launch.agent import (
    ENV_AGENT_TREE,
    KEY_BYE,
    KEY_FINAL,
    KEY_REPORTS,
    KEY_STATUS,
    KEY_STOP,
    AgentStatus,
    AgentWorker,
    final_path,
    read_order,
    record_path,
    write_order,
)
from tidal.launch.agent_config import AgentConfig
from tidal.launch.api import (
    JobLaunch,
    JobStatus,
    MetricPoint,
    WorkerState,
    read_reports,
    worker_logs,
)
from tidal.launch.file_modes import user_umask
from tidal.launch.process import kill_marked
from tidal.launch.slot_names import format_slot
from tidal.policy.api import Slot
from tidal.runtime.rendezvous import ReportQueue, connect_store

log = logging.getLogger("tidal.backends.local")

_START_TIMEOUT = 60.0
#: Tries to start a job's new agent after its agent died, before giving up on the restart.
_AGENT_STARTS = 3


@dataclass
class _Agent:
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


class LocalBackend:
    """Runs every job's workers on this machine; see the module docstring."""

    #: Everything :data:`~tidal.backends.base.LOCAL` lists; its workers see this
    #: host's files, so submission checks a spec's working dir and script.
    capabilities = replace(LOCAL, shared_files=True)

    def __init__(self, data_dir: Path, *, gpus: bool = False, timeout: float = 10.0) -> None:
        #: One record, config, log and final status per job's agent.
        self.state_dir = Path(data_dir) / "agents"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.gpus = gpus
        self.timeout = timeout
        self._agents: dict[str, _Agent] = {}
        self._log_dirs: dict[str, Path] = {}
        #: Jobs whose agent ended (succeeded or failed) while no backend watched it:
        #: reported once, by the first poll, so the controller records how they ended.
        self._ended: dict[str, JobStatus] = {}
        self._reattach()

    def _reattach(self) -> None:
        for record in sorted(self.state_dir.glob("*.agent.json")):
            try:
                data = json.loads(record.read_text())
                pid = int(data["pid"])
                os.kill(pid, 0)  # PermissionError: the pid is another user's now
                if not _process_alive(pid):
                    raise ProcessLookupError
            except (ValueError, KeyError, ProcessLookupError, PermissionError):
                record.unlink(missing_ok=True)
                continue
            job_id = str(data["job_id"])
            launch = self.state_dir / f"{job_id}.launch.json"
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
            agent = _Agent(job_id, int(data["pid"]), store, log_dir, tree=str(data.get("tree", "")))
            if store.check([KEY_STATUS]):
                agent.last = AgentStatus.from_json(store.get(KEY_STATUS))
                agent.assign_seq = agent.last.assign_seq
            # Past the last order written too, not only the last the agent reported: one
            # written just before the previous backend died may be taken after this read,
            # and the agent ignores any order whose number it has already seen.
            agent.assign_seq = max(agent.assign_seq, _written_seq(store))
            self._agents[job_id] = agent
            if log_dir is not None:
                self._log_dirs[job_id] = log_dir
            log.info("re-attached to job=%s agent pid=%d", job_id, agent.pid)
        self._find_ended()

    def _find_ended(self) -> None:
        """Agents that ended their job while no backend watched (the controller was
        down): their final status, so the job is recorded as it ended instead of being
        taken for lost and run again. A stopped one is left out: its job was released
        (it resumes from its checkpoint when started again)."""
        for final in sorted(self.state_dir.glob("*.final.json")):
            try:
                status = AgentStatus.from_json(final.read_text())
                ended = status.job_status()
            except (OSError, ValueError, TypeError, KeyError, AttributeError):
                continue  # unreadable: the job is taken for lost, as before
            if status.job_id in self._agents or status.outcome not in ("succeeded", "failed"):
                continue
            self._ended[status.job_id] = ended
            log.info("job=%s ended (%s) while no controller watched", status.job_id, status.outcome)

    @property
    def job_ids(self) -> list[str]:
        """Jobs this backend currently runs (including re-attached ones)."""
        return sorted(self._agents)

    def start(self, launch: JobLaunch, slots: Sequence[Slot]) -> None:
        """Start the job's agent, which starts one worker per worker's slots."""
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
        self._spawn_agent(config, launch.log_dir)

    def _spawn_agent(self, config: AgentConfig, log_dir: Path | None) -> _Agent:
        """Start an agent for ``config`` and wait until it serves its store."""
        config_path = self.state_dir / f"{config.job_id}.launch.json"
        config_path.write_text(config.to_json())
        agent_log = self.state_dir / f"{config.job_id}.agent.log"
        tree = f"{config.job_id}-{secrets.token_hex(8)}"
        # A killed agent leaves its record: waiting for the new one's must not find it.
        record_path(self.state_dir, config.job_id).unlink(missing_ok=True)
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
        agent = _Agent(config.job_id, process.pid, None, log_dir, process=process, tree=tree)
        self._agents[config.job_id] = agent
        if log_dir is not None:
            self._log_dirs[config.job_id] = log_dir
        self._connect(agent, deadline=time.monotonic() + _START_TIMEOUT)
        return agent

    def _restart_agent(self, dead: _Agent, slots: Sequence[Slot]) -> None:
        """A new agent for a job whose agent died: the same launch on ``slots``; its
        workers resume from the job's latest checkpoint, numbered after the old ones."""
        config_path = self.state_dir / f"{dead.job_id}.launch.json"
        config = AgentConfig.from_json(config_path.read_text())
        known = [w.worker_id for w in dead.died.workers] if dead.died else []
        config.slots = [format_slot(s) for s in slots]
        config.first_worker_id = max([config.first_worker_id - 1, *known]) + 1
        final_path(self.state_dir, dead.job_id).unlink(missing_ok=True)
        for attempt in range(1, _AGENT_STARTS + 1):
            log.warning("job=%s: starting a new agent on %d slot(s)", dead.job_id, len(slots))
            try:
                self._spawn_agent(config, dead.log_dir)
                return
            except (RuntimeError, TimeoutError, OSError) as exc:
                # Killed while starting (or its store not reachable): what it started
                # holds nothing yet; this restart is still the one the job was granted.
                failed = self._agents[dead.job_id]
                if failed.process is not None and failed.process.poll() is None:
                    failed.process.kill()
                    failed.process.wait(timeout=10)
                self._kill_tree(failed)
                if attempt == _AGENT_STARTS:
                    # The failed agent stays: the next poll reports its workers failed,
                    # and the restart decision counts that as the job's next failure.
                    raise
                self._agents[dead.job_id] = dead
                log.warning("job=%s: the new agent did not start: %s", dead.job_id, exc)

    def _connect(self, agent: _Agent, *, deadline: float) -> None:
        """Connect to the agent's store once its record is there. A job whose workers end
        at once may be over first: the agent writes its final status, removes the record
        and exits before this looks; the job is then started and over, and :meth:`poll`
        reads the final status."""
        record = record_path(self.state_dir, agent.job_id)
        final = final_path(self.state_dir, agent.job_id)
        while True:
            try:
                text = record.read_text()
                break
            except FileNotFoundError:
                pass
            if final.exists():
                return
            if agent.process is not None and agent.process.poll() is not None:
                if final.exists():  # written before the record went and the agent exited
                    return
                raise RuntimeError(
                    f"job {agent.job_id}: agent exited with status {agent.process.returncode}; "
                    f"see {self.state_dir / (agent.job_id + '.agent.log')}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {agent.job_id}: agent did not start in time")
            time.sleep(0.01)
        host, _, port = str(json.loads(text)["store"]).rpartition(":")
        try:
            agent.store = connect_store(host, int(port), timeout=10)
        except Exception:
            if not final.exists():
                raise
            # Over between the record and the connection: poll reads the final status.

    def assign(self, job_id: str, slots: Sequence[Slot]) -> None:
        """Set the job's slots (applied at its next step boundary)."""
        agent = self._agents[job_id]
        if agent.died is not None:
            self._restart_agent(agent, slots)
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
        agent.stopped = True
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
            alive = _pid_alive(agent)
            if not alive:
                # Nothing serves its store any more: a call would only fail (and torch
                # logs each such failure as a warning of many lines).
                agent.store, agent.reports = None, None
            # Reports first: reading the final status lets go of the agent's store.
            reports[job_id] = self._reports(agent)
            status = self._read(agent)
            if status is not None:
                agent.last = status
            if agent.last is None:
                if not alive:
                    unstarted = self._unreported(job_id)
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
        return statuses

    def _kill_tree(self, agent: _Agent) -> None:
        if agent.tree:
            killed = kill_marked(agent.tree, variable=ENV_AGENT_TREE)
            if killed:
                log.warning("job=%s: killed %d process(es) its agent left", agent.job_id, killed)

    def _unreported(self, job_id: str) -> AgentStatus | None:
        """An agent that died before its first status: the workers it was to start, as it
        numbers them (one per slot, from ``first_worker_id``), still starting."""
        try:
            config = AgentConfig.from_json((self.state_dir / f"{job_id}.launch.json").read_text())
        except (OSError, ValueError, TypeError):
            return None
        workers = [
            AgentWorker(config.first_worker_id + i, slot, WorkerState.STARTING.value, None, None)
            for i, slot in enumerate(config.slots)
        ]
        return AgentStatus(job_id, -1, workers)

    def _on_agent_death(self, agent: _Agent, last: AgentStatus) -> JobStatus:
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

    def _reports(self, agent: _Agent) -> tuple[tuple[MetricPoint, ...], dict[str, Any] | None]:
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

    def _read(self, agent: _Agent) -> AgentStatus | None:
        final = final_path(self.state_dir, agent.job_id)
        if final.exists():
            self._let_go(agent)
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
                    self._let_go(agent)
                return status
        except Exception:  # the agent (and its store) is gone
            agent.store = None
        return None

    @staticmethod
    def _let_go(agent: _Agent) -> None:
        """The agent ended: drop its store, then tell it so (:data:`KEY_BYE`), in that
        order, so no call reaches its store after it closed (each such call logs a
        multi-line warning of torch's)."""
        store, agent.store, agent.reports = agent.store, None, None
        if store is not None:
            with contextlib.suppress(Exception):  # gone already (its wait timed out)
                store.set(KEY_BYE, "1")

    def log_paths(self, job_id: str) -> Mapping[int, Path]:
        """Each worker's log file by worker id."""
        return worker_logs(self._log_dirs.get(job_id))

    def close(self, grace: float = 30.0) -> None:
        """Stop every job (workers checkpoint and leave) and wait for the agents to end."""
        for job_id in list(self._agents):
            self.stop(job_id)
        deadline = time.monotonic() + grace
        for agent in list(self._agents.values()):
            while _pid_alive(agent) and time.monotonic() < deadline:
                if final_path(self.state_dir, agent.job_id).exists():
                    self._let_go(agent)  # it waits for that before it exits
                time.sleep(0.02)
            if _pid_alive(agent):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(agent.pid, signal.SIGKILL)
            if agent.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    agent.process.wait(timeout=5)
        self._agents.clear()


def _written_seq(store: dist.Store) -> int:
    """The number of the last assignment written to the agent's store (0 if none)."""
    try:
        order = read_order(store)
    except (RuntimeError, ValueError, KeyError, TypeError):
        return 0  # unreadable: the agent's own report stands
    return 0 if order is None else order[0]


def _pid_alive(agent: _Agent) -> bool:
    if agent.process is not None:
        return agent.process.poll() is None
    return _process_alive(agent.pid)


def _process_alive(pid: int) -> bool:
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
