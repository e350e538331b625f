"""``tidal run``: a local launcher like torchrun, whose jobs resize in place."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from rich.console import Console

from tidal.launch.group_api import GroupEvent, Outcome
from tidal.launch.launchers import RESTART_BASED, Group, make_group, resize_mode
from tidal.launch.run_args import UsageProblem, worker_argv
from tidal.launch.runs import RunRecord, register, unregister
from tidal.launch.worker import Worker, WorkerPhase, WorkerSpec
from tidal.policy.restart import Fail, LostWorker, Restart, RestartView, decide_restart
from tidal.runtime.api import ENV_BACKEND

#: One entry per NVIDIA GPU the driver knows.
_PROC_GPUS = Path("/proc/driver/nvidia/gpus")


def visible_gpus(environ: Mapping[str, str], proc_gpus: Path) -> list[str]:
    """The GPUs a worker of this machine may be given, as ``CUDA_VISIBLE_DEVICES`` names
    them: the launcher's own ``CUDA_VISIBLE_DEVICES`` when set, else every NVIDIA GPU the
    driver lists (read from ``/proc``, so the launcher needs no CUDA library)."""
    given = environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [d.strip() for d in given.split(",") if d.strip() and d.strip() != "-1"]
    try:
        return [str(i) for i in range(sum(1 for _ in proc_gpus.iterdir()))]
    except OSError:
        return []


def worker_slots(max_workers: int, gpus: Sequence[str]) -> list[str]:
    """The slots of a run's workers: one GPU each where the machine has GPUs (NCCL refuses
    two ranks on one GPU), else ``local:0 .. local:N-1`` on the CPU. Raises
    :class:`UsageProblem` when there are GPUs but fewer than ``max_workers``."""
    if not gpus:
        return [f"local:{i}" for i in range(max_workers)]
    if max_workers > len(gpus):
        raise UsageProblem(
            f"--workers: at most {len(gpus)} worker(s) here, one per GPU (got a maximum of "
            f"{max_workers}); set {ENV_BACKEND}=gloo to run the workers on the CPU instead"
        )
    return [f"local:{g}" for g in gpus[:max_workers]]


@dataclass
class RunOptions:
    """Everything ``tidal run`` was asked to do."""

    command: list[str]
    min_workers: int
    max_workers: int
    initial: int
    max_restarts: int = 3
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    checkpoint_every_seconds: float = 0.0
    timeout: float = 10.0
    sync_every: int = 1
    log_dir: Path | None = None
    resize_plan: list[tuple[int, int]] = field(default_factory=list)
    #: ``tidal`` (in-place resize) or ``torchrun`` (torchrun's environment, restart-based).
    launcher: str = "tidal"
    #: Seconds between SIGTERM and SIGKILL when a torchrun-launched group restarts.
    stop_grace: float = 30.0


def run(options: RunOptions, console: Console) -> int:
    """Run the job until it ends; returns the launcher's exit status."""
    lock = threading.Lock()

    def show_output(worker_id: str, line: str) -> None:
        with lock:
            sys.stdout.write(f"[{worker_id}] {line}\n")
            sys.stdout.flush()

    def show_event(event: GroupEvent) -> None:
        stall = f" in {event.stall * 1e3:.0f} ms" if event.stall is not None else ""
        with lock:
            # One line per event (not wrapped at the terminal's width): the rank, worker
            # id and pid of every member stay on the generation's line.
            console.print(
                f"[bold cyan]tidal[/] {event.kind}: {event.message}{stall}",
                highlight=False,
                soft_wrap=True,
            )

    # With TIDAL_BACKEND=gloo the workers train on the CPU: no GPU is handed out.
    on_cpu = os.environ.get(ENV_BACKEND) == "gloo"
    gpus = [] if on_cpu else visible_gpus(os.environ, _PROC_GPUS)
    pool = worker_slots(options.max_workers, gpus)
    spec = WorkerSpec(
        argv=worker_argv(options.command),
        # Each worker sees only its slot's GPU (CUDA_VISIBLE_DEVICES), so it uses cuda:0.
        gpus=bool(gpus),
        run_id=options.run_id,
        log_dir=options.log_dir,
        checkpoint_dir=options.checkpoint_dir,
        checkpoint_every_steps=options.checkpoint_every,
        checkpoint_every_seconds=options.checkpoint_every_seconds,
        timeout=options.timeout,
        sync_every=options.sync_every,
        launcher=options.launcher,
        max_restarts=options.max_restarts,
        stop_grace=options.stop_grace,
    )
    failures: list[Worker] = []
    group = make_group(spec, on_output=show_output, on_event=show_event, on_failure=failures.append)
    restarts = 0
    group.start(pool[: options.initial])
    register(
        RunRecord(
            options.run_id,
            os.getpid(),
            group.host.address,
            options.min_workers,
            options.max_workers,
        )
    )
    console.print(
        f"[bold cyan]tidal[/] run {options.run_id}: {options.initial} workers "
        f"({options.min_workers}:{options.max_workers}), {options.launcher} launcher: "
        f"{resize_mode(options.launcher)}; resize with "
        f"`tidal resize {options.run_id} --workers N`",
        highlight=False,
    )
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    plan = list(options.resize_plan)
    seen_seq = 0
    try:
        while True:
            outcome = group.poll()
            if outcome is None and failures:
                decision = _decide(group, failures, options, restarts)
                failures.clear()
                if decision is not None:
                    restarts = decision.restarts
                if isinstance(decision, Fail):
                    group.fail(decision.reason)
                    outcome = group.outcome
                elif isinstance(decision, Restart):
                    show_event(GroupEvent("restart", decision.reason))
                    group.assign(group.desired)  # a fresh worker on each failed slot
            if outcome is not None:
                break
            if stopping.is_set():
                console.print("[bold cyan]tidal[/] stopping: releasing workers", highlight=False)
                group.stop()
                break
            request = group.host.resize_request()
            if request is not None and int(request["seq"]) > seen_seq:
                seen_seq = int(request["seq"])
                n = max(options.min_workers, min(options.max_workers, int(request["workers"])))
                resize(group, n, pool)
                show_event(GroupEvent("resize", f"asked for {n} workers"))
            if plan and group.settled():
                progress = group.progress()
                if progress is not None and int(str(progress["step"])) >= plan[0][0]:
                    step, n = plan.pop(0)
                    resize(group, n, pool)
                    show_event(GroupEvent("resize", f"step {step}: asked for {n} workers"))
            time.sleep(group.poll_interval())
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if group.outcome is None:
            group.stop()
        else:
            group.stop(grace=0)
        unregister(options.run_id)
    outcome = group.outcome
    console.print(
        f"[bold cyan]tidal[/] run {options.run_id} {outcome.value if outcome else 'ended'} "
        f"(restarts: {restarts})",
        highlight=False,
    )
    return 0 if outcome is Outcome.SUCCEEDED else 1


def resize(group: Group, workers: int, pool: Sequence[str]) -> list[str]:
    """Assign ``group`` the first ``workers`` of its current slots in rank order (survivors
    keep the lowest ranks) and free slots of ``pool``; returns the slots asked for."""
    keep = [s for s in group.member_slots() if s in group.desired][:workers]
    for slot in group.desired:
        if len(keep) < workers and slot not in keep:
            keep.append(slot)
    for slot in pool:
        if len(keep) >= workers:
            break
        if slot not in keep:
            keep.append(slot)
    group.assign(keep)
    return keep


def _decide(
    group: Group, failed: list[Worker], options: RunOptions, restarts: int
) -> Fail | Restart | None:
    """What :func:`~tidal.policy.restart.decide_restart` says about ``failed``, the
    workers the group lost in its last poll: the same decision the controller makes."""
    view = RestartView(
        max_restarts=options.max_restarts,
        restarts=restarts,
        # Newcomers not admitted yet hold no training state: only members count.
        group_gone=all(group.workers[m].phase is WorkerPhase.EXITED for m in group.members),
        checkpoint=_has_checkpoint(options.checkpoint_dir),
        whole_group=options.launcher in RESTART_BASED,
    )
    lost = [LostWorker(w.id, w.slot.rpartition(":")[0], w.exit_code) for w in failed]
    decision = decide_restart(view, lost)
    return decision if isinstance(decision, (Fail, Restart)) else None


def _has_checkpoint(directory: str | None) -> bool:
    if not directory:
        return False
    from tidal.runtime.checkpoint import list_checkpoints  # loads torch: only when needed

    return bool(list_checkpoints(directory))
