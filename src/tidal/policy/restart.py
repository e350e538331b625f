"""Restart or fail: what to do when a job's workers are lost, as a pure function.

One decision point for every launcher: the controller calls :func:`decide_restart` when
its backend reports failed workers, and ``tidal run`` calls it when its group does. A
worker group never replaces a failed worker by itself; it starts a new one on a slot only
when it is assigned that slot again, which is what a :class:`Restart` leads to.

The restart budget means the same everywhere: ``max_restarts`` failures are survived and
the next one fails the job. The workers lost together on one host (in one observation)
are one failure: a lost node with four of the job's workers costs one restart, not four.

A worker that fails before it joins its group (a missing file, a bad import) with the
same error as the time before is in a crash loop: as Kubernetes' ``CrashLoopBackOff``
does, the next start waits, 10 s after the second such failure and twice as long each
time after, at most 5 minutes (:func:`crash_loop_delay`), and the job's reason says so
with the error. A script that needs torchrun's environment (``environment variable RANK
expected, but not set``) under another launcher fails at once, naming the flag that runs
it: no restart can fix it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "CRASH_LOOP_BASE",
    "CRASH_LOOP_CAP",
    "Fail",
    "LostWorker",
    "Noop",
    "Restart",
    "RestartDecision",
    "RestartView",
    "crash_loop_delay",
    "decide_restart",
    "needs_torchrun",
]

#: Seconds a crash-looping worker waits before its second start; doubled each time after.
CRASH_LOOP_BASE = 10.0
#: The longest wait between a crash-looping worker's starts (Kubernetes' 5 minutes).
CRASH_LOOP_CAP = 300.0
#: What torch.distributed's ``env://`` says of a variable torchrun sets and nothing else did.
_TORCHRUN_ENV = re.compile(
    r"environment variable (RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT|LOCAL_RANK) "
    r"expected, but not set"
)


@dataclass(frozen=True)
class LostWorker:
    """A worker that stopped running, as the launcher observed it."""

    worker_id: str
    #: The host its slot is on: losses are counted per host.
    host: str
    #: The process's exit status (negative: killed by that signal); ``None`` if unknown.
    exit_code: int | None
    #: It left because it was asked to (scale in, preemption, stop; ``EXIT_RELEASED``) or
    #: was stopped by its group before it held any state: not a failure.
    released: bool = False

    @property
    def finished(self) -> bool:
        """The user's program returned 0: the worker is done, not failed."""
        return self.exit_code == 0 and not self.released


@dataclass(frozen=True)
class RestartView:
    """What the decision needs to know about the job."""

    #: Failures the job survives; the one after that fails it.
    max_restarts: int
    #: Failures survived so far.
    restarts: int
    #: No worker holding the training state is left (newcomers not admitted yet hold
    #: none): a restart resumes from a durable checkpoint.
    group_gone: bool = False
    #: A durable checkpoint exists to resume from (only matters when ``group_gone``).
    checkpoint: bool = True
    #: The job's launcher restarts every worker after a failure (``torchrun``): nothing
    #: survives in memory, and the script resumes from its own checkpoint.
    whole_group: bool = False
    #: The failed workers never joined their group (no step taken, none reported ready).
    before_join: bool = False
    #: The error that ended them (an exception's line, or ``exit N``), if known.
    cause: str | None = None
    #: Failures before joining in a row with this same ``cause``, this one included.
    loop_count: int = 1
    #: The job runs its workers with torchrun's environment (``--launcher torchrun``).
    torchrun: bool = False


@dataclass(frozen=True)
class Restart:
    """Replace the failed workers: assign the job its slots again."""

    #: Failures survived, this one included (the job's new ``restarts``).
    restarts: int
    #: The failed workers and their exit statuses, in the order given.
    workers: tuple[str, ...]
    exit_codes: tuple[int | None, ...]
    #: Why, for the user.
    reason: str
    #: Every worker is gone: the new ones start from the latest checkpoint (or afresh).
    from_checkpoint: bool = False
    #: Seconds to wait before starting the new workers (a crash loop's back-off).
    delay: float = 0.0


@dataclass(frozen=True)
class Fail:
    """The restart budget is spent: end the job as failed."""

    restarts: int
    workers: tuple[str, ...]
    exit_codes: tuple[int | None, ...]
    reason: str


@dataclass(frozen=True)
class Noop:
    """Nothing failed (the workers finished or were released): nothing to do."""

    reason: str


RestartDecision = Restart | Fail | Noop


def crash_loop_delay(loop_count: int) -> float:
    """Seconds before the next start of a worker that failed ``loop_count`` times in a row
    before joining with the same error: none after the first, then 10 s doubling to 5 min."""
    if loop_count < 2:
        return 0.0
    return min(CRASH_LOOP_CAP, CRASH_LOOP_BASE * 2.0 ** min(loop_count - 2, 32))


def needs_torchrun(cause: str | None) -> bool:
    """Whether ``cause`` is torch.distributed asking for a variable torchrun sets."""
    return cause is not None and _TORCHRUN_ENV.search(cause) is not None


def decide_restart(job: RestartView, lost: Sequence[LostWorker]) -> RestartDecision:
    """Whether the job survives losing ``lost`` (the workers seen gone in one observation).

    Finished and released workers are not failures. Each host that lost a worker costs
    one restart; past ``job.max_restarts`` the job fails. A crash loop backs off (see the
    module docstring); a script that needs torchrun's environment fails at once."""
    failed = [w for w in lost if not w.released and not w.finished]
    if not failed:
        return Noop("no worker failed")
    restarts = job.restarts + len({w.host for w in failed})
    workers = tuple(w.worker_id for w in failed)
    codes = tuple(w.exit_code for w in failed)
    ids = ", ".join(workers)
    limit = job.max_restarts
    if job.before_join and not job.torchrun and needs_torchrun(job.cause):
        return Fail(
            job.restarts,
            workers,
            codes,
            f"worker {ids} failed before joining: the script reads torchrun's environment; "
            "submit it with --launcher torchrun (launcher: torchrun in a spec)",
        )
    if restarts > limit:
        when = " before joining" if job.before_join else ""
        return Fail(
            restarts,
            workers,
            codes,
            f"worker {ids} failed{when} (exit {list(codes)}); restart limit {limit} reached",
        )
    count = f"(restart {restarts}/{limit})"
    if job.before_join:
        delay = crash_loop_delay(job.loop_count)
        if delay > 0:
            error = f": {job.cause}" if job.cause else ""
            reason = (
                f"crash loop: worker {ids} failed {job.loop_count} times in a row before "
                f"joining{error}; next start in {delay:.0f}s {count}"
            )
            return Restart(restarts, workers, codes, reason, from_checkpoint=False, delay=delay)
        # It never held any state: nothing is resumed, from a checkpoint or otherwise.
        return Restart(
            restarts,
            workers,
            codes,
            f"worker {ids} failed before joining; starting it again {count}",
        )
    if job.whole_group:
        reason = f"worker {ids} failed; restarting every worker from the script's checkpoint"
        return Restart(restarts, workers, codes, f"{reason} {count}", from_checkpoint=True)
    if job.group_gone:
        source = "the latest checkpoint" if job.checkpoint else "the start (no checkpoint yet)"
        reason = f"worker {ids} failed and none survived; restarting from {source}"
        return Restart(restarts, workers, codes, f"{reason} {count}", from_checkpoint=True)
    return Restart(restarts, workers, codes, f"replacing failed worker {ids} {count}")
