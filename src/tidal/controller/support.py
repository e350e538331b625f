"""What this server can run: the one place a job the spec allows, but no launcher or
controller part here can run yet, is refused before anything is stored.

A spec may describe more than a server runs (a ``tf`` chief beside ``ps`` replicas, a
restart policy of ``Never``). Accepting such a job would leave it queued or failing for
good, so ``POST /jobs`` (and ``/jobs/validate``) refuse it with a 422 naming the role and
field. Each unavailable capability is one entry in the sets below: the part that adds it
removes its entry, and nothing else changes.
"""

from __future__ import annotations

from tidal.model import Job, Launcher, RestartKind, Role

__all__ = [
    "MAX_GPUS_PER_REPLICA",
    "UNAVAILABLE_FEATURES",
    "UNAVAILABLE_LAUNCHERS",
    "UNAVAILABLE_RESTART_POLICIES",
    "unsupported",
]

#: Launchers no part of this server starts yet.
UNAVAILABLE_LAUNCHERS: frozenset[Launcher] = frozenset({Launcher.TF, Launcher.MPI, Launcher.PS})
#: Restart policies the controller does not apply yet: it restarts failed replicas within
#: the restart budget (``OnFailure``) and nothing else.
UNAVAILABLE_RESTART_POLICIES: frozenset[RestartKind] = frozenset(
    {RestartKind.NEVER, RestartKind.ALWAYS, RestartKind.EXIT_CODE}
)
#: Job shapes the controller cannot run yet:
#: ``several roles`` — more than one role in a job (gang placement of fixed roles);
#: ``several gpus`` — more than one GPU per replica (a replica holds one slot).
UNAVAILABLE_FEATURES: frozenset[str] = frozenset({"several roles", "several gpus"})
#: GPUs one replica may hold while ``several gpus`` is unavailable.
MAX_GPUS_PER_REPLICA = 1

_NOT_YET = "is not available on this server yet"


def _role_problems(role: Role, named: bool) -> list[tuple[str, str]]:
    # A one-role job written without `roles:` has no role names in its fields.
    where = f"roles.{role.name}." if named else ""
    problems: list[tuple[str, str]] = []
    if role.launcher in UNAVAILABLE_LAUNCHERS:
        problems.append((f"{where}launcher", f"the {role.launcher.value!r} launcher {_NOT_YET}"))
    if role.restart.policy in UNAVAILABLE_RESTART_POLICIES:
        problems.append(
            (
                f"{where}restart.policy",
                f"restart policy {role.restart.policy.value!r} {_NOT_YET} "
                "(failed replicas restart within the budget: OnFailure)",
            )
        )
    if "several gpus" in UNAVAILABLE_FEATURES and role.resources.gpus > MAX_GPUS_PER_REPLICA:
        problems.append(
            (
                f"{where}resources.gpus",
                f"{role.resources.gpus} GPUs per replica {_NOT_YET} "
                f"(at most {MAX_GPUS_PER_REPLICA})",
            )
        )
    return problems


def unsupported(job: Job, *, named_roles: bool = True) -> list[tuple[str, str]]:
    """Every ``(field path, message)`` this server cannot run in ``job``; empty if it can.

    ``named_roles``: whether the spec listed ``roles:`` (paths name the role:
    ``roles.ps.launcher``) or was one implicit worker (paths are top-level fields).
    """
    problems: list[tuple[str, str]] = []
    if "several roles" in UNAVAILABLE_FEATURES and len(job.roles) > 1:
        names = ", ".join(r.name for r in job.roles)
        problems.append(("roles", f"a job with several roles ({names}) {_NOT_YET}"))
    for role in job.roles:
        problems.extend(_role_problems(role, named_roles))
    return problems
