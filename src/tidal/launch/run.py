"""``tidal run``: a local launcher like torchrun, whose jobs resize in place."""

from __future__ import annotations

import os
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console

from tidal.launch.api import JobStatus
from tidal.launch.driver import GroupDriver
from tidal.launch.groups.api import GroupEvent, JobGroup
from tidal.launch.launchers import RESTART_BASED, resize_mode
from tidal.launch.run_args import UsageProblem, worker_argv
from tidal.launch.runs import RunRecord, register, unregister
from tidal.launch.slot_names import slot_host
from tidal.launch.worker import Worker, WorkerPhase, WorkerSpec
from tidal.policy.restart import Fail, LostWorker, Restart, RestartView, decide_restart
from tidal.runtime.env import ENV_BACKEND

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
        gpu=bool(gpus),
        job_id=options.run_id,
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
    driver = GroupDriver(
        options.run_id,
        spec,
        on_output=show_output,
        on_event=show_event,
        on_failure=failures.append,
    )
    control = RunControl(driver.group, options, pool, failures, show=show_event, console=console)
    driver.start(control.desired)
    register(
        RunRecord(
            options.run_id,
            os.getpid(),
            driver.group.host.address,
            options.min_workers,
            options.max_workers,
        )
    )
    console.print(
        f"[bold cyan]tidal[/] run {options.run_id}: {options.initial} workers "
        f"({options.min_workers}:{options.max_workers}), {options.launcher} launcher: "
        f"{resize_mode(options.launcher)}; resize with "
        f"`tidal resize {options.run_id} N`",
        highlight=False,
    )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        control.stopping = True

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        final = driver.drive(control)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        unregister(options.run_id)
    # An error in the group itself (the driver logged it) ends the run as failed.
    outcome = driver.group.outcome
    said = "failed" if final.failed else outcome.value if outcome else "ended"
    console.print(
        f"[bold cyan]tidal[/] run {options.run_id} {said} (restarts: {control.restarts})",
        highlight=False,
    )
    return 0 if final.finished else 1


class RunControl:
    """``tidal run``'s orders for its :class:`~tidal.launch.driver.GroupDriver` (a
    :class:`~tidal.launch.driver.JobControl`): a fresh worker for each failed one while
    :func:`~tidal.policy.restart.decide_restart` allows, the sizes ``tidal resize`` asks
    for (through the job's store) and ``--resize-at`` plans, and a stop on SIGINT or
    SIGTERM. What it decides it says on the console as the group's events are."""

    def __init__(
        self,
        group: JobGroup,
        options: RunOptions,
        pool: Sequence[str],
        failures: list[Worker],
        *,
        show: Callable[[GroupEvent], None],
        console: Console,
    ) -> None:
        """``pool``: every slot the run may use; ``failures``: the workers the group
        reported failed, not decided on yet (the driver's ``on_failure`` appends them);
        ``show``: how an event of the run's own is shown."""
        self.group = group
        self.options = options
        self.pool = list(pool)
        self.failures = failures
        self.show = show
        self.console = console
        #: The slots last asked for (the first ``--initial`` of the pool at the start).
        self.desired = self.pool[: options.initial]
        #: Restarts the budget was charged for so far.
        self.restarts = 0
        #: Set on SIGINT or SIGTERM: the run releases its workers and ends.
        self.stopping = False
        self._plan = list(options.resize_plan)
        self._seen_seq = 0

    def requests(self) -> tuple[Sequence[str] | None, bool]:
        """Decide on the workers that failed since the last call, then take a stop, a
        ``tidal resize`` request, or the plan's next step once the group is settled."""
        slots: list[str] | None = None
        if self.failures:
            decision = _decide(self.group, self.failures, self.options, self.restarts)
            self.failures.clear()
            if decision is not None:
                self.restarts = decision.restarts
            if isinstance(decision, Fail):
                self.group.fail(decision.reason)  # the driver's next poll ends the run
                return None, False
            if isinstance(decision, Restart):
                self.show(GroupEvent("restart", decision.reason))
                slots = list(self.desired)  # a fresh worker on each failed slot
        if self.stopping:
            self.console.print("[bold cyan]tidal[/] stopping: releasing workers", highlight=False)
            return None, True
        request = self.group.host.resize_request()
        if request is not None and int(request["seq"]) > self._seen_seq:
            self._seen_seq = int(request["seq"])
            n = max(
                self.options.min_workers, min(self.options.max_workers, int(request["workers"]))
            )
            slots = self._resize(n)
            self.show(GroupEvent("resize", f"asked for {n} workers"))
        elif self._plan and self.group.settled():
            # (After a resize taken just now the group is not settled: the plan waits.)
            progress = self.group.host.progress()
            if progress is not None and int(str(progress["step"])) >= self._plan[0][0]:
                step, n = self._plan.pop(0)
                slots = self._resize(n)
                self.show(GroupEvent("resize", f"step {step}: asked for {n} workers"))
        return slots, False

    def publish(self, status: JobStatus, ended: bool, reports: list[dict[str, Any]]) -> None:
        """Nothing: the console shows the group's events and the workers' output as they
        happen, and the run's end once :meth:`GroupDriver.drive` returns."""

    def _resize(self, workers: int) -> list[str]:
        generation = self.group.generation
        members = generation.members if generation is not None else ()
        held = [self.group.workers[m].slot for m in members]
        self.desired = resized_slots(held, self.desired, workers, self.pool)
        return self.desired


def resized_slots(
    members: Sequence[str], desired: Sequence[str], workers: int, pool: Sequence[str]
) -> list[str]:
    """The first ``workers`` of the slots asked for, members' first in rank order
    (``members``: the slots the current generation holds; survivors keep the lowest
    ranks), then the other asked-for slots, then free slots of ``pool``."""
    keep = [s for s in members if s in desired][:workers]
    for slot in desired:
        if len(keep) < workers and slot not in keep:
            keep.append(slot)
    for slot in pool:
        if len(keep) >= workers:
            break
        if slot not in keep:
            keep.append(slot)
    return keep


def _decide(
    group: JobGroup, failed: list[Worker], options: RunOptions, restarts: int
) -> Fail | Restart | None:
    """What :func:`~tidal.policy.restart.decide_restart` says about ``failed``, the
    workers the group lost in its last poll: the same decision the controller makes."""
    members = group.generation.members if group.generation is not None else ()
    view = RestartView(
        max_restarts=options.max_restarts,
        restarts=restarts,
        # Newcomers not admitted yet hold no training state: only members count.
        group_gone=all(group.workers[m].phase is WorkerPhase.EXITED for m in members),
        checkpoint=_has_checkpoint(options.checkpoint_dir),
        whole_group=options.launcher in RESTART_BASED,
    )
    lost = [LostWorker(w.id, slot_host(w.slot), w.exit_code) for w in failed]
    decision = decide_restart(view, lost)
    return decision if isinstance(decision, (Fail, Restart)) else None


def _has_checkpoint(directory: str | None) -> bool:
    if not directory:
        return False
    from tidal.runtime.checkpoint import list_checkpoints  # loads torch: only when needed

    return bool(list_checkpoints(directory))
