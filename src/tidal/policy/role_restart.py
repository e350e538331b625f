"""Per-role restart policies and the success rule of a multi-role job, as pure functions.

A role's ``restart.policy`` (Kubeflow's) says what one of its replicas' exit means:

``OnFailure``  a non-zero exit is restarted within the job's restart budget;
``Never``      never restarted: the job fails, unless the role does not end the job (its
               success is not needed: it stays down and the job goes on);
``Always``     restarted whenever it exits while the job runs, also with status 0;
``ExitCode``   Kubeflow's rule: statuses 1-127 are the program's own verdict (permanent:
               the job fails); a signal (128-255, or a negative status: killed by that
               signal) or anything else is retryable within the budget.

Restarts of every role count against the one restart budget of the job
(:func:`tidal.policy.restart.decide_restart`). :func:`job_outcome` is Kubeflow's success
policy: the job succeeds once every role that ends it has finished with 0 on every
replica; the other roles (parameter servers) are then stopped.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "ReplicaExit",
    "RoleProgress",
    "RoleRule",
    "Verdict",
    "exit_verdict",
    "job_outcome",
    "replica_name",
    "respawns",
    "sort_exits",
]


class Verdict(str, enum.Enum):
    """What one replica's exit means for the job."""

    #: Not a failure (exit 0 under a policy that lets a replica finish).
    DONE = "done"
    #: Start it again, counting one restart against the job's budget.
    RESTART = "restart"
    #: The job fails now.
    FAIL = "fail"
    #: Left down; the job goes on without it.
    IGNORE = "ignore"


def exit_verdict(policy: str, exit_code: int | None, *, ends_job: bool) -> Verdict:
    """What a replica of a role under restart ``policy`` exiting with ``exit_code``
    (``None``: unknown, as after a lost host) means; ``ends_job``: whether the role's
    success is needed for the job's (see the module docstring)."""
    if policy == "Always":
        return Verdict.RESTART
    if exit_code == 0:
        return Verdict.DONE
    if policy == "Never":
        return Verdict.FAIL if ends_job else Verdict.IGNORE
    if policy == "ExitCode":
        permanent = exit_code is not None and 1 <= exit_code <= 127
        return Verdict.FAIL if permanent else Verdict.RESTART
    if policy == "OnFailure":
        return Verdict.RESTART
    raise ValueError(
        f"restart.policy: expected Never, OnFailure, Always or ExitCode, got {policy!r}"
    )


def respawns(policy: str, exit_code: int | None) -> bool:
    """Whether a replica that exited with ``exit_code`` is started again when its slot is
    assigned again (what a role's group does; the restart decision is the controller's)."""
    if policy == "Always":
        return True
    return exit_code != 0 and policy != "Never"


def replica_name(role: str, index: int | None) -> str:
    """How a reason names a replica: ``roles.ps[1]``."""
    return f"roles.{role}[{index if index is not None else '?'}]"


@dataclass(frozen=True)
class RoleProgress:
    """How far one role of a running job is."""

    #: Whether the job succeeds once this role has (Kubeflow's successPolicy).
    ends_job: bool
    #: Every replica of the role finished with 0.
    succeeded: bool = False
    #: The role's group failed for good.
    failed: bool = False


def job_outcome(roles: Mapping[str, RoleProgress]) -> str | None:
    """``"failed"`` once a role failed, ``"succeeded"`` once every role that ends the job
    (every role, when none is marked) succeeded, else ``None`` (still running)."""
    if any(p.failed for p in roles.values()):
        return "failed"
    enders = [p for p in roles.values() if p.ends_job] or list(roles.values())
    if enders and all(p.succeeded for p in enders):
        return "succeeded"
    return None


@dataclass(frozen=True)
class ReplicaExit:
    """One replica seen failed, as the controller's restart decision sees it."""

    role: str
    index: int | None
    exit_code: int | None


@dataclass(frozen=True)
class RoleRule:
    """What the decision needs of a role: its restart policy and whether it ends the job."""

    policy: str = "OnFailure"
    ends_job: bool = True


def sort_exits(
    rules: Mapping[str, RoleRule], exits: Sequence[ReplicaExit]
) -> tuple[str | None, list[int]]:
    """Apply each role's restart policy to ``exits`` (replicas seen failed together):
    the reason the job fails now (``roles.ps[1] exited with status 3 (restart policy
    Never)``) or ``None``, and the positions in ``exits`` to restart within the budget
    (:func:`tidal.policy.restart.decide_restart` then counts them). A role not in ``rules``
    is taken as ``OnFailure``."""
    restart: list[int] = []
    for i, ex in enumerate(exits):
        rule = rules.get(ex.role, RoleRule())
        verdict = exit_verdict(rule.policy, ex.exit_code, ends_job=rule.ends_job)
        if verdict is Verdict.FAIL:
            return (
                f"{replica_name(ex.role, ex.index)} exited with status {ex.exit_code} "
                f"(restart policy {rule.policy})",
                [],
            )
        if verdict is Verdict.RESTART:
            restart.append(i)
    return None, restart
