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

When the group ends, the agent writes ``<job>.final.json`` beside its record and exits.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from tidal.launch.group import GroupEvent, Outcome, WorkerGroup, WorkerSpec, WorkerState
from tidal.runtime.api import EXIT_RELEASED
from tidal.runtime.rendezvous import ReportQueue

log = logging.getLogger("tidal.agent")

KEY_ASSIGN = "agent/assign"
KEY_STOP = "agent/stop"
KEY_STATUS = "agent/status"
REPORT_PREFIX = "agent/report/"


@dataclass
class AgentWorker:
    """One worker as the agent reports it."""

    id: int
    slot: str
    state: str  # starting, running, released, exited, failed
    pid: int | None
    exit_code: int | None


@dataclass
class AgentStatus:
    """What the agent publishes about its job."""

    job_id: str
    generation: int
    workers: list[AgentWorker] = field(default_factory=list)
    assign_seq: int = 0
    outcome: str | None = None
    reason: str = ""
    #: Events since the agent started: kind, message, time, stall (seconds or None).
    events: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_json(cls, raw: str | bytes) -> AgentStatus:
        """Parse what the agent published."""
        data = json.loads(raw)
        data["workers"] = [AgentWorker(**w) for w in data.get("workers", [])]
        return cls(**data)


@dataclass
class AgentConfig:
    """How to run the job; written by the backend as ``<job>.launch.json``."""

    job_id: str
    argv: list[str]
    slots: list[str]
    env: dict[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    log_dir: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every_steps: int = 0
    checkpoint_every_seconds: float = 0.0
    gpus: bool = False
    timeout: float = 10.0


def record_path(state_dir: Path, job_id: str) -> Path:
    """Where a live agent says how to reach it."""
    return state_dir / f"{job_id}.agent.json"


def final_path(state_dir: Path, job_id: str) -> Path:
    """Where an agent leaves its job's final status."""
    return state_dir / f"{job_id}.final.json"


def worker_state(state: WorkerState, exit_code: int | None, killed: bool) -> str:
    """A group's worker as a backend reports it: starting, running, released, exited or
    failed."""
    if state is not WorkerState.EXITED:
        return "running" if state in (WorkerState.MEMBER, WorkerState.LEAVING) else "starting"
    if exit_code == 0:
        return "exited"
    if exit_code == EXIT_RELEASED or killed:
        return "released"  # a worker the group stopped itself did not fail
    return "failed"


def _status(group: WorkerGroup, job_id: str, seq: int, events: list[dict[str, Any]]) -> AgentStatus:
    workers = [
        AgentWorker(
            id=int(w.id.lstrip("w")),
            slot=w.slot,
            state=worker_state(w.state, w.exit_code, w.killed),
            pid=w.process.pid,
            exit_code=w.exit_code,
        )
        for w in group.workers.values()
    ]
    outcome = group.outcome.value if group.outcome is not None else None
    reason = ""
    if group.outcome is Outcome.FAILED:
        reason = next((e["message"] for e in reversed(events) if e["kind"] == "failed"), "failed")
    return AgentStatus(
        job_id=job_id,
        generation=group.generation.number if group.generation else -1,
        workers=workers,
        assign_seq=seq,
        outcome=outcome,
        reason=reason,
        events=events[-200:],
    )


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def serve(config: AgentConfig, state_dir: Path) -> int:
    """Run the job until it ends or the backend stops it; returns the exit status."""
    events: list[dict[str, Any]] = []

    def on_event(event: GroupEvent) -> None:
        events.append(
            {"kind": event.kind, "message": event.message, "time": event.time, "stall": event.stall}
        )

    spec = WorkerSpec(
        argv=config.argv,
        run_id=config.job_id,
        env=config.env,
        cwd=config.working_dir,
        log_dir=Path(config.log_dir) if config.log_dir else None,
        checkpoint_dir=config.checkpoint_dir,
        checkpoint_every_steps=config.checkpoint_every_steps,
        checkpoint_every_seconds=config.checkpoint_every_seconds,
        # The controller counts failures against the job's budget and stops the job.
        max_restarts=1 << 30,
        timeout=config.timeout,
        gpus=config.gpus,
    )
    group = WorkerGroup(spec, on_event=on_event)
    store = group.host.store
    group.start(config.slots)
    _write_atomic(
        record_path(state_dir, config.job_id),
        json.dumps({"job_id": config.job_id, "pid": os.getpid(), "store": group.host.address}),
    )
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    seq = 0
    published = ""
    last_publish = 0.0
    reports = ReportQueue(store, REPORT_PREFIX)

    def pass_reports(read: bool = False) -> None:
        # The workers' batches, on to whoever polls the agent (the backend). Kept whole:
        # the controller reads metrics and the goodput report out of them.
        for batch in group.take_reports(read=read):
            reports.push(json.dumps(batch))

    while True:
        outcome = group.poll()
        pass_reports()
        if not stopping and store.check([KEY_STOP]):
            stopping = True
        if stopping:
            group.stop()
            break
        if store.check([KEY_ASSIGN]):
            request = json.loads(store.get(KEY_ASSIGN))
            if int(request["seq"]) > seq:
                seq = int(request["seq"])
                group.assign(list(request["slots"]))
        status = json.dumps(asdict(_status(group, config.job_id, seq, events)))
        now = time.monotonic()
        if status != published or now - last_publish > 1.0:
            store.set(KEY_STATUS, status)
            published, last_publish = status, now
        if outcome is not None:
            break
        time.sleep(group.poll_interval())
    pass_reports(read=True)
    final = _status(group, config.job_id, seq, events)
    if final.outcome is None:
        final.outcome = Outcome.STOPPED.value
    _write_atomic(final_path(state_dir, config.job_id), json.dumps(asdict(final)))
    store.set(KEY_STATUS, json.dumps(asdict(final)))
    record_path(state_dir, config.job_id).unlink(missing_ok=True)
    # Give a backend polling right now the chance to read the final status from the store.
    time.sleep(0.2)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m tidal.launch.agent CONFIG.json STATE_DIR``."""
    parser = argparse.ArgumentParser(description="tidal per-job agent")
    parser.add_argument("config", type=Path)
    parser.add_argument("state_dir", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = AgentConfig(**json.loads(args.config.read_text()))
    return serve(config, args.state_dir)


if __name__ == "__main__":
    sys.exit(main())
