"""Restart or fail: what to do when a job's workers are lost, as a pure function.

One decision point for every launcher: the controller calls :func:`decide_restart` when
its backend reports failed workers, and ``tidal run`` calls it when its group does. A
worker group never replaces a failed worker by itself; it starts a new one on a slot only
when it is assigned that slot again, which is what a :class:`Restart` leads to.

The restart budget means the same everywhere: ``max_restarts`` failures are survived and
the next one fails the job. The workers lost together on one host (in one observation)
are one failure: a lost node with four of the job's workers costs one restart, not four.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Fail",
    "LostWorker",
    "Noop",
    "Restart",
    "RestartDecision",
    "RestartView",
    "decide_restart",
]


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


def decide_restart(job: RestartView, lost: Sequence[LostWorker]) -> RestartDecision:
    """Whether the job survives losing ``lost`` (the workers seen gone in one observation).

    Finished and released workers are not failures. Each host that lost a worker costs
    one restart; past ``job.max_restarts`` the job fails."""
    failed = [w for w in lost if not w.released and not w.finished]
    if not failed:
        return Noop("no worker failed")
    restarts = job.restarts + len({w.host for w in failed})
    workers = tuple(w.worker_id for w in failed)
    codes = tuple(w.exit_code for w in failed)
    ids = ", ".join(workers)
    limit = job.max_restarts
    if restarts > limit:
        return Fail(
            restarts,
            workers,
            codes,
            f"worker {ids} failed (exit {list(codes)}); restart limit {limit} reached",
        )
    if job.whole_group:
        reason = f"worker {ids} failed; restarting every worker from the script's checkpoint"
        return Restart(
            restarts, workers, codes, f"{reason} (restart {restarts}/{limit})", from_checkpoint=True
        )
    if job.group_gone:
        source = "the latest checkpoint" if job.checkpoint else "the start (no checkpoint yet)"
        reason = f"worker {ids} failed and none survived; restarting from {source}"
        return Restart(
            restarts, workers, codes, f"{reason} (restart {restarts}/{limit})", from_checkpoint=True
        )
    return Restart(
        restarts, workers, codes, f"replacing failed worker {ids} (restart {restarts}/{limit})"
    )
