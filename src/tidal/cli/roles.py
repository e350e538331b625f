"""What ``tidal get`` and ``tidal logs`` show of a job's roles: replicas per role, the
Kubeflow-style conditions, and which worker a role's replica is."""

from __future__ import annotations

from datetime import datetime

from rich.table import Table

from tidal.cli.table_style import plain_table
from tidal.wire.schema import JobDetail

__all__ = ["conditions_table", "replica_worker", "roles_table"]


def roles_table(detail: JobDetail) -> Table:
    """Replicas per role: wanted, active, succeeded, failed."""
    table = plain_table("ROLE", "REPLICAS", "ACTIVE", "SUCCEEDED", "FAILED", title="roles")
    for r in detail.roles:
        table.add_row(r.name, str(r.replicas), str(r.active), str(r.succeeded), str(r.failed))
    return table


def conditions_table(detail: JobDetail) -> Table:
    """The conditions the job went through; the current one is marked ``True``."""
    table = plain_table("TYPE", "STATUS", "REASON", "SINCE", "MESSAGE", title="conditions")
    for c in detail.conditions:
        since = datetime.fromtimestamp(c.last_transition_time).strftime("%H:%M:%S")
        table.add_row(c.type, c.status, c.reason, since, c.message)
    return table


def replica_worker(detail: JobDetail, role: str, index: int) -> int:
    """The worker id of replica ``index`` of ``role``: its latest worker (a restarted
    replica has had several). Raises ``ValueError`` naming ``--role`` or ``--index``."""
    names = [r.name for r in detail.roles] or sorted({w.role for w in detail.worker_list})
    if role not in names:
        listed = ", ".join(names)
        raise ValueError(f"--role: job {detail.id} has no role {role!r} (roles: {listed})")
    ids = [w.worker_id for w in detail.worker_list if w.role == role and w.index == index]
    if not ids:
        known = sorted(
            {w.index for w in detail.worker_list if w.role == role and w.index is not None}
        )
        raise ValueError(
            f"--index: role {role!r} has had no replica {index} "
            f"(replicas seen: {', '.join(map(str, known)) or 'none'})"
        )
    return max(ids)
