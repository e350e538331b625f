"""How the CLI shows jobs and the cluster to people: the rich tables of ``tidal list``,
``tidal get``, ``tidal cluster`` and ``tidal top``.

Importing this module stays light (``tidal --help``): the views are only named in type hints,
and the parts of ``tidal get`` that need more load when it prints.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from tidal.cli.table_style import plain_table
from tidal.launch.slot_names import join_slots

if TYPE_CHECKING:
    from tidal.wire.cluster import ClusterView, TeamQueueView
    from tidal.wire.schema import EventView, JobDetail, JobView

__all__ = [
    "cluster_table",
    "jobs_table",
    "print_job_detail",
    "queues_table",
    "size_text",
    "target_text",
]

#: Below this many columns the jobs' reasons go on lines of their own under the table:
#: squeezed into the last column they wrapped one word per line at 80 columns.
WIDE = 120

_STATE_STYLE = {
    "queued": "yellow",
    "running": "green",
    "rescaling": "cyan",
    "succeeded": "bold green",
    "failed": "bold red",
    "cancelled": "dim",
}


def _age(since: float | None) -> str:
    if since is None:
        return "-"
    seconds = max(0, int(time.time() - since))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _state(state: str) -> Text:
    return Text(state, style=_STATE_STYLE.get(state, ""))


def _adaptive(job: JobView) -> str:
    """``256 eff 0.82 ×3.1``: batch, statistical efficiency, predicted speed-up (or -)."""
    if job.batch_size is None:
        return "-"
    text = str(job.batch_size)
    if job.efficiency is not None:
        text += f" eff {job.efficiency:.2f}"
    if job.speedup is not None:
        text += f" ×{job.speedup:.1f}"
    return text


def size_text(job: JobView) -> str:
    """The job's size in workers: ``3 [1-3]`` (now [min-max]), ``→4`` for a target, and
    ``×2`` when each worker holds 2 slots (its GPUs). A server that does not count
    workers sends slots, which are workers when each holds one."""
    counts = job.worker_counts
    if counts is None:
        text = f"{job.workers} [{job.min_slots}-{job.max_slots}]"
        return text + (f" →{job.target_slots}" if job.target_slots is not None else "")
    text = f"{counts.now} [{counts.min}-{counts.max}]"
    if counts.target is not None:
        text += f" →{counts.target}"
    if counts.slots_per_worker > 1:
        text += f" ×{counts.slots_per_worker}"
    return text


def target_text(job: JobView) -> str:
    """What a resize verb asked for, for people: ``target 2 worker(s)``, and the slots
    they hold when a worker holds several (``target 2 worker(s) (4 slots)``)."""
    counts = job.worker_counts
    if counts is None:  # a server that does not count workers: one worker a slot
        return f"target {job.target_slots} worker(s)"
    text = f"target {counts.target} worker(s)"
    if counts.slots_per_worker > 1 and job.target_slots is not None:
        text += f" ({job.target_slots} slots)"
    return text


def jobs_table(jobs: Iterable[JobView], width: int | None = None) -> RenderableType:
    """One row per job: its state, workers (and target), batch, priority, restarts, age
    and reason; narrower than :data:`WIDE` columns (``width``), each reason on a line of
    its own under the table, after the job's id."""
    jobs = list(jobs)
    inline = width is None or width >= WIDE
    table = plain_table()
    columns = ("ID", "STATE", "WORKERS", "BATCH", "PRIORITY", "RESTARTS", "AGE")
    for column in (*columns, "REASON") if inline else columns:
        table.add_column(column, no_wrap=column != "REASON")
    for j in jobs:
        table.add_row(
            j.id,
            _state(j.state),
            size_text(j),
            _adaptive(j),
            str(j.priority),
            str(j.restarts),
            _age(j.submitted_at),
            *([j.reason] if inline else []),
        )
    notes = [] if inline else [Text(f"{j.id}: {j.reason}") for j in jobs if j.reason]
    return Group(table, *notes) if notes else table


def _role_commands(spec: dict[str, Any] | None) -> list[tuple[str, list[str]]]:
    """``(label, command)`` per role of a stored spec: ``command`` for a one-role job."""
    spec = spec or {}
    roles = spec.get("roles")
    if not roles:
        return [("command", list(spec.get("command", [])))]
    return [(f"{r['name']} ({r.get('launcher', 'tidal')})", list(r["command"])) for r in roles]


def size_line(job: JobView) -> str | None:
    """``size: …`` for a one-role job: its workers now, its target and why they differ
    (``None`` for a job of several roles, whose tables say it per role)."""
    spec = job.spec or {}
    if spec.get("roles"):
        return None
    width = max(1, int((spec.get("resources") or {}).get("gpus", 1) or 1))
    workers = spec.get("workers") or {}
    initial = workers.get("initial") if isinstance(workers, dict) else None
    now, low, high = job.workers // width, job.min_slots // width, job.max_slots // width
    if low == high:
        return f"size: {now} worker(s) of a fixed {high}"
    if job.target_slots is not None:
        target, source = job.target_slots // width, "set by scale"
    elif isinstance(initial, int) and initial < high:
        target, source = initial, "--workers / workers.initial"
    else:
        return (
            f"size: {now} worker(s), no target: grows into idle slots up to {high}, "
            f"gives them back down to {low} when other jobs need them"
        )
    if job.state in ("succeeded", "failed", "cancelled"):
        why = "the job is over"
    elif now == target:
        why = "at its target"
    elif now > target:
        why = f"{now - target} above it: idle slots lent, or a shrink under way"
    elif job.state == "queued":
        why = "waiting for slots"
    else:
        why = "short of its target: other jobs hold the slots, or the change is under way"
    return f"size: {now} worker(s), target {target} ({source}; {low}-{high}): {why}"


def cluster_table(view: ClusterView) -> Table:
    """One row per host: its kind, group, slots, slots in use and the jobs using them."""
    table = plain_table("HOST", "KIND", "GROUP", "SLOTS", "USED", "JOBS")
    for h in view.hosts:
        users = sorted({u for u in h.used_by if u})
        used = sum(1 for u in h.used_by if u)
        table.add_row(
            h.name if h.draining is None else f"{h.name} (draining)",
            "gpu" if h.gpu else "cpu",
            h.group or "-",
            str(h.slots),
            str(used),
            ", ".join(users) or "-",
        )
    return table


def queues_table(queues: Iterable[TeamQueueView]) -> Table:
    """Each team's quota and what it holds, borrows and lends, in slots (80 columns)."""
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("team", overflow="fold")
    for name in ("guaranteed", "limit", "used", "borrowed", "lent"):
        table.add_column(name, justify="right")
    for q in queues:
        limit = "-" if q.limit is None else str(q.limit)
        used = Text(str(q.used), style="bold" if q.used > q.guaranteed else "")
        table.add_row(
            q.team, str(q.guaranteed), limit, used, str(q.borrowed or "-"), str(q.lent or "-")
        )
    return table


def drain_lines(view: ClusterView, now: float) -> list[str]:
    """One line per draining host: who asked, when it goes, what is still on it."""
    lines = []
    for h in view.hosts:
        drain = h.draining
        if drain is None:
            continue
        when = "" if drain.leaves_at is None else f", goes in {max(0, drain.leaves_at - now):.0f}s"
        still = ", ".join(drain.remaining) if drain.remaining else "nothing (drained)"
        lines.append(f"{h.name}: draining ({drain.source}{when}); still on it: {still}")
        for order in drain.checkpoints:
            lines.append(
                f"  {order.job}: cannot leave in place; checkpoints in "
                f"{max(0, order.at - now):.0f}s and resumes elsewhere"
            )
    return lines


def print_job_detail(console: Console, detail: JobDetail, events: Sequence[EventView]) -> None:
    """Print one job for ``tidal get``: its row, commands and launcher, roles and
    conditions (a job of several roles), workers, and ``events``."""
    console.print(jobs_table([detail], width=0))
    size = size_line(detail)
    if size is not None:
        console.print(size, markup=False)
    counts = detail.worker_counts
    if counts is not None and counts.slots_per_worker > 1:
        console.print(
            f"slots: {len(detail.slots)} held, {counts.slots_per_worker} per worker "
            f"(min {detail.min_slots}, max {detail.max_slots})",
            markup=False,
        )
    for role, command in _role_commands(detail.spec):
        # Quoted as a shell would take it: an argument with a blank shows as one.
        console.print(f"{role}: {shlex.join(command)}", markup=False)
    if "roles" not in detail.spec:
        from tidal.model import Launcher

        launcher = Launcher(str(detail.spec.get("launcher", Launcher.TIDAL.value)))
        console.print(f"launcher: {launcher.value} ({launcher.resize_mode})", markup=False)
    several = len(detail.roles) > 1
    if several:
        from tidal.cli.roles import conditions_table, roles_table

        console.print(roles_table(detail))
        console.print(conditions_table(detail))
    if detail.worker_list:
        columns = ("WORKER", "ROLE", "SLOT", "PID", "STATE", "EXIT")
        table = plain_table(*(columns if several else columns[:1] + columns[2:]), title="workers")
        for w in detail.worker_list:
            where = [f"{w.role}[{'-' if w.index is None else w.index}]"] if several else []
            table.add_row(
                str(w.worker_id),
                *where,
                join_slots(w.host, w.slots or [w.slot]),
                str(w.pid or "-"),
                w.state,
                "-" if w.exit_code is None else str(w.exit_code),
            )
        console.print(table)
    table = plain_table("TIME", "KIND", "MESSAGE", title="events")
    for e in events:
        table.add_row(datetime.fromtimestamp(e.time).strftime("%H:%M:%S"), e.kind, e.message)
    console.print(table)
