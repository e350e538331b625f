"""What a server can run: the one place a job the spec allows, but this server's backend
cannot run, is refused before anything is stored.

A spec may describe more than a backend runs (a launcher it lacks, several roles on a
backend that runs one group), or a replica wider than any host (:func:`too_wide`).
Accepting such a job would leave it queued or failing for good, so ``POST /jobs`` (and
``/jobs/validate``) refuse it with a 422 naming the role and field.
A backend says what it runs with a :class:`Capabilities` (its ``capabilities``
attribute); one that says nothing runs what :data:`LOCAL` lists (the local backend).
"""

from __future__ import annotations

from tidal.backends.base import LOCAL, ONE_GROUP, Capabilities
from tidal.controller.cluster import ClusterModel
from tidal.model import Job, RestartKind, Role

__all__ = [
    "LOCAL",
    "ONE_GROUP",
    "Capabilities",
    "capabilities_of",
    "too_wide",
    "unsupported",
]


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
    elif role.restart.policy is RestartKind.ALWAYS and role.launcher.forms_group:
        problems.append(
            (
                f"{where}restart.policy",
                "restart policy 'Always' needs a tf, mpi or ps launcher: a "
                f"{role.launcher.value!r} group ends when its training does",
            )
        )
    if role.launcher.fixed_count and role.replicas.elastic:
        problems.append(
            (
                f"{where}replicas",
                f"a {role.launcher.value!r} role has a fixed count (TF_CONFIG lists every "
                f"replica): got {role.replicas.min}:{role.replicas.max}",
            )
        )
    return problems


def too_wide(job: Job, cluster: ClusterModel, *, named_roles: bool = True) -> list[tuple[str, str]]:
    """Every ``(field path, message)`` for a role whose one replica needs more slots than
    any host ``job`` may run on has (any host at all, when none matches the job's target
    yet: such a job is accepted and waits, saying why, unless no host could hold it)."""
    widest = cluster.widest(job.placement.group, job.placement.labels)
    if widest is None:
        widest = cluster.widest(None, {})
    if widest is None:
        return []
    problems: list[tuple[str, str]] = []
    for role in job.roles:
        if role.resources.slots > widest:
            where = f"roles.{role.name}." if named_roles else ""
            problems.append(
                (
                    f"{where}resources.gpus",
                    f"{role.resources.gpus} GPUs per replica, all on one host: the hosts "
                    f"this job may run on have at most {widest} slot(s)",
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
    protocol = [r.name for r in job.roles if r.launcher.forms_group]
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
