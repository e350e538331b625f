"""A per-job agent: one process that owns a job's :class:`WorkerGroup` on this host.

The local backend starts one agent per job in its own session, so a job's workers and its
rendezvous store outlive the controller: ``kill -9`` the server and the agents go on
training; a new server finds them again through their records in the state folder.

The agent and the backend talk through the job's store (keys under ``agent/``):

``agent/assign``  JSON ``{"slots": ["host:i", ...], "seq": n}`` written by the backend
``agent/stop``    present once the backend ended the job
``agent/status``  JSON :class:`AgentStatus`, written by the agent when it changes
``agent/report/`` a :class:`~tidal.runtime.rendezvous.ReportQueue` of the workers' report
                  batches (metrics, goodput), passed on as they arrive
``agent/final``   the final status, written once the group ended (as ``<job>.final.json``)
``agent/bye``     written by the backend once it read the final status: the agent may
                  close its store (a client still talking to a closed store logs a
                  warning of many lines)

The agent runs its group through :class:`~tidal.launch.driver.GroupDriver`, as the Ray
backend does in a thread. It never replaces a failed worker by itself: the controller
decides, and assigns the slot again. When the group ends, the agent writes
``<job>.final.json`` beside its record and exits.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from types import FrameType
from typing import Any

import torch.distributed as dist

from tidal.launch.agent_config import AgentConfig
from tidal.launch.api import JobLaunch, JobStatus, WorkerState, WorkerStatus
from tidal.launch.driver import GroupDriver
from tidal.launch.file_modes import private_files
from tidal.launch.limits import enforcement, format_bytes
from tidal.launch.script_imports import script_imports
from tidal.launch.slot_names import format_slots, status_slots
from tidal.launch.warm import WarmSpawner
from tidal.launch.warm_plan import available_memory, plan_warm_pool, requested_pool
from tidal.launch.worker import worker_spec
from tidal.runtime.rendezvous import ReportQueue

log = logging.getLogger("tidal.agent")

#: Set by the backend to a token unique to each agent it starts; the agent's workers and
#: everything they start inherit it, so the backend can kill what an agent that died left.
ENV_AGENT_TREE = "TIDAL_AGENT_TREE"

KEY_ASSIGN = "agent/assign"
KEY_STOP = "agent/stop"
KEY_STATUS = "agent/status"
KEY_FINAL = "agent/final"
KEY_BYE = "agent/bye"
#: How long an ended agent waits for the backend to let go of its store: a backend busy
#: starting other jobs may not poll for a while, and none may watch at all.
BYE_TIMEOUT_S = 30.0
#: The agent's queue of report batches for the backend (the workers' own queue, which the
#: agent drains, is :data:`tidal.runtime.report.REPORT_PREFIX`).
KEY_REPORTS = "agent/report/"


def write_order(store: dist.Store, slots: Sequence[str], seq: int) -> None:
    """Write the backend's assignment of ``slots``, numbered ``seq`` (an agent takes an
    order only once, and only one numbered past every order it took)."""
    store.set(KEY_ASSIGN, json.dumps({"slots": list(slots), "seq": seq}))


def read_order(store: dist.Store) -> tuple[int, list[str]] | None:
    """The last assignment written: its number and its slots; ``None`` before the first."""
    if not store.check([KEY_ASSIGN]):
        return None
    order = json.loads(store.get(KEY_ASSIGN))
    return int(order["seq"]), list(order["slots"])


@dataclass
class AgentWorker:
    """One worker as the agent reports it."""

    id: int
    slot: str
    state: str  # a WorkerState value: starting, running, released, exited, failed
    pid: int | None
    exit_code: int | None
    #: The role it is a replica of, and its index (records of earlier releases: worker).
    role: str = "worker"
    index: int | None = None
    cause: str | None = None


@dataclass
class AgentStatus:
    """What the agent publishes about its job: a :class:`JobStatus` as JSON, with the
    last assignment it applied and how its group ended (``None`` while running)."""

    job_id: str
    generation: int
    workers: list[AgentWorker] = field(default_factory=list)
    assign_seq: int = 0
    outcome: str | None = None  # succeeded, failed or stopped
    reason: str = ""

    @classmethod
    def from_json(cls, raw: str | bytes) -> AgentStatus:
        """Parse what the agent published (fields it does not know are left out: an
        agent of an earlier release also sent its events)."""
        data = json.loads(raw)
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        worker_fields = {f.name for f in fields(AgentWorker)}
        data["workers"] = [
            AgentWorker(**{k: v for k, v in w.items() if k in worker_fields})
            for w in data.get("workers", [])
        ]
        return cls(**data)

    @classmethod
    def of(cls, status: JobStatus, *, assign_seq: int, ended: bool) -> AgentStatus:
        """``status`` as the agent publishes it."""
        outcome = None
        if status.finished:
            outcome = "succeeded"
        elif status.failed:
            outcome = "failed"
        elif ended:
            outcome = "stopped"
        workers = [
            AgentWorker(
                w.worker_id,
                format_slots(w.held),
                w.state.value,
                w.pid,
                w.exit_code,
                w.role,
                w.index,
                w.cause,
            )
            for w in status.workers
        ]
        return cls(status.job_id, status.generation, workers, assign_seq, outcome, status.reason)

    def job_status(self) -> JobStatus:
        """The job as a backend reports it."""
        workers = tuple(
            WorkerStatus(
                worker_id=w.id,
                **status_slots(w.slot),
                state=WorkerState(w.state),
                pid=w.pid,
                exit_code=w.exit_code,
                role=w.role,
                index=w.index,
                cause=w.cause,
            )
            for w in self.workers
        )
        return JobStatus(
            job_id=self.job_id,
            generation=self.generation,
            workers=workers,
            finished=self.outcome == "succeeded",
            failed=self.outcome == "failed",
            reason=self.reason,
        )


def record_path(state_dir: Path, job_id: str) -> Path:
    """Where a live agent says how to reach it."""
    return state_dir / f"{job_id}.agent.json"


def final_path(state_dir: Path, job_id: str) -> Path:
    """Where an agent leaves its job's final status."""
    return state_dir / f"{job_id}.final.json"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


class StoreControl:
    """The agent's :class:`~tidal.launch.driver.JobControl`: orders and status through
    the job's store (see the module docstring)."""

    def __init__(self, store: dist.Store, on_running: Callable[[], None] | None = None) -> None:
        """Read and write the agent's keys in ``store``; call ``on_running`` once, at the
        first status in which a worker trains."""
        self.store = store
        self._on_running = on_running
        self.stopping = False
        self.seq = 0
        self._reports = ReportQueue(store, KEY_REPORTS)
        self._published = ""
        self._published_at = 0.0

    def requests(self) -> tuple[Sequence[str] | None, bool]:
        """The newest assignment not applied yet, and whether the backend stopped the job."""
        if not self.stopping and self.store.check([KEY_STOP]):
            self.stopping = True
        order = None if self.stopping else read_order(self.store)
        if order is None or order[0] <= self.seq:
            return None, self.stopping
        self.seq, slots = order
        return slots, False

    def publish(self, status: JobStatus, ended: bool, reports: list[dict[str, Any]]) -> None:
        """Pass the workers' batches on whole (the controller reads metrics and the goodput
        report out of them); write the status when it changed, and at least every second."""
        for batch in reports:
            self._reports.push(json.dumps(batch))
        if self._on_running is not None and any(
            w.state is WorkerState.RUNNING for w in status.workers
        ):
            on_running, self._on_running = self._on_running, None
            on_running()
        text = json.dumps(asdict(AgentStatus.of(status, assign_seq=self.seq, ended=ended)))
        now = time.monotonic()
        if ended or text != self._published or now - self._published_at > 1.0:
            self.store.set(KEY_STATUS, text)
            self._published, self._published_at = text, now


def _pool_size(launch: JobLaunch) -> int:
    """How many warm interpreters the job keeps once its first workers train."""
    try:
        requested = requested_pool(launch.env)
    except ValueError as exc:
        log.warning("job=%s: starting workers cold: %s", launch.job_id, exc)
        return 0
    plan = plan_warm_pool(
        requested=requested,
        launcher=launch.launcher if not launch.roles else "its roles",
        min_workers=launch.min_workers,
        max_workers=launch.max_workers,
        available_bytes=available_memory(),
    )
    log.info("job=%s: warm pool of %d: %s", launch.job_id, plan.size, plan.reason)
    return plan.size


def _warm_spawner(launch: JobLaunch, preload: Sequence[str]) -> WarmSpawner | None:
    """The job's pool of warm interpreters (not started yet), or ``None`` for none."""
    size = _pool_size(launch)
    if size == 0:
        return None
    return WarmSpawner(size, preload=preload, env=launch.env, fill=False)


def _adopt(pool: WarmSpawner, launch: JobLaunch, preload: Sequence[str]) -> Callable[[], None]:
    """What to do once the job's first workers train, when it started from a standby's
    ``pool``: keep as many as the job's own plan says (ending the rest, or filling)."""

    def keep() -> None:
        pool.keep(_pool_size(launch), preload=preload)

    return keep


def serve(config: AgentConfig, state_dir: Path, pool: WarmSpawner | None = None) -> int:
    """Run the job until it ends or the backend stops it; returns the exit status.
    ``pool``: a standby's warm interpreters, which the job's first workers start from."""
    launch = config.launch
    log.info(
        "job=%s: each worker may use %s CPU(s) and %s of memory: %s",
        launch.job_id,
        f"{launch.cpus:g}" if launch.cpus is not None else "any",
        format_bytes(launch.memory) if launch.memory is not None else "any amount",
        enforcement(gpu=launch.gpu),
    )
    # The backend read the script already; a config without its findings is read here.
    preload = config.preload if config.preload is not None else script_imports(launch.argv)
    spawner = pool if pool is not None else _warm_spawner(launch, preload)
    if pool is not None:
        on_running: Callable[[], None] | None = _adopt(pool, launch, preload)
    else:
        on_running = spawner.fill if spawner is not None else None
    driver = GroupDriver(
        launch.job_id,
        worker_spec(launch, timeout=config.timeout),
        spawner=spawner,
        first_worker_id=config.first_worker_id,
        roles=launch.roles,
        work_dir=launch.log_dir.parent if launch.log_dir is not None else None,
    )
    control = StoreControl(driver.group.host.store, on_running=on_running)
    driver.start(config.slots)
    # A first status before the record that lets the backend connect: a backend that
    # polls between the two would otherwise find no status and take the job for lost.
    control.publish(driver.status(), False, [])
    _write_atomic(
        record_path(state_dir, config.job_id),
        json.dumps(
            {
                "job_id": config.job_id,
                "pid": os.getpid(),
                "store": driver.group.host.address,
                # Every process of the job carries it: how the backend finds them all.
                "tree": os.environ.get(ENV_AGENT_TREE, ""),
            }
        ),
    )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        control.stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    final = driver.drive(control)
    if spawner is not None:
        spawner.close()
    text = json.dumps(asdict(AgentStatus.of(final, assign_seq=control.seq, ended=True)))
    # In the store too, where the backend finds it should the file not be written.
    control.store.set(KEY_FINAL, text)
    try:
        _write_atomic(final_path(state_dir, config.job_id), text)
    except OSError as exc:
        # A full disk: the backend reads the same final status from the store.
        log.warning("job=%s: final status not written (%s)", config.job_id, exc)
    record_path(state_dir, config.job_id).unlink(missing_ok=True)
    _await_bye(control.store)
    return 0


def _await_bye(store: dist.Store) -> None:
    """Keep the store served until the backend has read the final status and let go of
    it (:data:`KEY_BYE`), or :data:`BYE_TIMEOUT_S` passed (no backend watches)."""
    deadline = time.monotonic() + BYE_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if store.check([KEY_BYE]):
                return
        except Exception:  # the store itself failed: nobody can be told anything
            return
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    """``python -m tidal.launch.agent CONFIG.json STATE_DIR``."""
    parser = argparse.ArgumentParser(description="tidal per-job agent")
    parser.add_argument("config", type=Path)
    parser.add_argument("state_dir", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = AgentConfig.from_json(args.config.read_text())
    # Its records and the workers' logs are private; the workers get the user's umask.
    with private_files():
        return serve(config, args.state_dir)


if __name__ == "__main__":
    sys.exit(main())
