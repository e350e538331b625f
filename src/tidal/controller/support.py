"""What a server can run: the one place a job the spec allows, but this server's backend
cannot run, is refused before anything is stored.

A spec may describe more than a backend runs (several roles on the Ray backend, more than
one GPU per replica). Accepting such a job would leave it queued or failing for good, so
``POST /jobs`` (and ``/jobs/validate``) refuse it with a 422 naming the role and field.
A backend says what it runs with a :class:`Capabilities` (its ``capabilities``
attribute); one that says nothing runs what :data:`LOCAL` lists (the local backend).
"""

from __future__ import annotations

from tidal.backends.base import LOCAL, ONE_GROUP, Capabilities
from tidal.model import Job, Launcher, RestartKind, Role

__all__ = [
    "LOCAL",
    "MAX_GPUS_PER_REPLICA",
    "ONE_GROUP",
    "Capabilities",
    "capabilities_of",
    "unsupported",
]

#: GPUs one replica may hold (a replica holds one slot).
MAX_GPUS_PER_REPLICA = 1
#: Launchers whose role forms one group with its own protocol; a job has at most one.
_PROTOCOL = frozenset({Launcher.TIDAL, Launcher.TORCHRUN})
#: Launchers whose replicas find each other at fixed addresses: their role is fixed.
_FIXED_ONLY = frozenset({Launcher.TF})


def capabilities_of(backend: object) -> Capabilities:
    """What ``backend`` says it runs (:data:`LOCAL` when it says nothing)."""
    found = getattr(backend, "capabilities", None)
    return found if isinstance(found, Capabilities) else LOCAL


def _role_problems(role: Role, named: bool, can: Capabilities) -> list[tuple[str, str]]:
    # A one-role job written without `roles:` has no role names in its fields.
    where = f"roles.{role.name}." if named else ""
    problems: list[tuple[str, str]] = []
    if role.launcher not in can.launchers:
        problems.append(
            (
                f"{where}launcher",
                f"the {role.launcher.value!r} launcher is not available on {can.name}",
            )
        )
    if role.restart.policy not in can.restart_policies:
        problems.append(
            (
                f"{where}restart.policy",
                f"restart policy {role.restart.policy.value!r} is not available on {can.name}",
            )
        )
    elif role.restart.policy is RestartKind.ALWAYS and role.launcher in _PROTOCOL:
        problems.append(
            (
                f"{where}restart.policy",
                "restart policy 'Always' needs a tf, mpi or ps launcher: a "
                f"{role.launcher.value!r} group ends when its training does",
            )
        )
    if role.launcher in _FIXED_ONLY and role.replicas.elastic:
        problems.append(
            (
                f"{where}replicas",
                f"a {role.launcher.value!r} role has a fixed count (TF_CONFIG lists every "
                f"replica): got {role.replicas.min}:{role.replicas.max}",
            )
        )
    if role.resources.gpus > MAX_GPUS_PER_REPLICA:
        problems.append(
            (
                f"{where}resources.gpus",
                f"{role.resources.gpus} GPUs per replica is not available on {can.name} yet "
                f"(at most {MAX_GPUS_PER_REPLICA})",
            )
        )
    return problems


def unsupported(
    job: Job, *, named_roles: bool = True, capabilities: Capabilities = LOCAL
) -> list[tuple[str, str]]:
    """Every ``(field path, message)`` a backend of ``capabilities`` cannot run in
    ``job``; empty if it can.

    ``named_roles``: whether the spec listed ``roles:`` (paths name the role:
    ``roles.ps.launcher``) or was one implicit worker (paths are top-level fields).
    """
    can = capabilities
    problems: list[tuple[str, str]] = []
    if len(job.roles) > 1 and not can.several_roles:
        names = ", ".join(r.name for r in job.roles)
        problems.append(
            ("roles", f"a job with several roles ({names}) is not available on {can.name}")
        )
    protocol = [r.name for r in job.roles if r.launcher in _PROTOCOL]
    if len(protocol) > 1:
        problems.append(
            (
                "roles",
                "at most one role may use the tidal or torchrun launcher "
                f"(got {', '.join(protocol)})",
            )
        )
    for role in job.roles:
        problems.extend(_role_problems(role, named_roles, can))
    return problems
