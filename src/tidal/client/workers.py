"""Workers launched from the SDK: their ids, the specs that start them, and what they are
doing now.

:meth:`tidal.client.Client.launch_workers` submits one job of ``n`` fixed replicas and
names each replica ``"<job id>/<worker index>"``; :meth:`~tidal.client.Client.await_workers`
reads the jobs back and :func:`summarise` tells, for each named worker, whether it is up,
done or lost. Everything here is pure: plain values in, plain values out; the client does
the requests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tidal.spec_fields import MAX_CPUS, MAX_WORKERS, NAME_RE, parse_memory, shown
from tidal.wire.schema import JobDetail, WorkerView

__all__ = [
    "STARTED_STATES",
    "WorkerArgumentError",
    "WorkerRef",
    "WorkerReport",
    "argument_problems",
    "command_of",
    "launch_spec",
    "launched",
    "memory_of",
    "parse_worker_ids",
    "summarise",
    "unknown_worker",
]

#: Worker states that mean the worker's program started (it may have finished already).
STARTED_STATES = frozenset({"running", "exited"})
#: Worker states that mean the worker's process is over.
ENDED_STATES = frozenset({"exited", "failed", "released"})
_JOB_ENDED = frozenset({"succeeded", "failed", "cancelled", "unreadable"})
_ID_RE = re.compile(r"([^/\s]+)/([0-9]{1,9})")
#: A memory given as a number is in GiB, as Cloudera ML's ``memory=0.5`` is.
_GIB = 2**30
#: The kernels a worker may be asked for: tidal runs Python workers only.
PYTHON_KERNELS = frozenset({"python3", "python"})


class WorkerArgumentError(ValueError):
    """An argument of a workers verb is wrong; the message names it. Nothing was sent."""


@dataclass(frozen=True, order=True)
class WorkerRef:
    """One worker: the job it belongs to and its worker index in that job."""

    job: str
    index: int

    def __str__(self) -> str:
        return f"{self.job}/{self.index}"


def _flat(ids: Any) -> list[Any]:
    """``ids`` as a flat list: one id, a dict with an ``"id"``, or any nesting of lists."""
    if isinstance(ids, str | Mapping):
        return [ids]
    if isinstance(ids, Iterable):
        return [item for part in ids for item in _flat(part)]
    return [ids]


def parse_worker_ids(ids: Any, argument: str = "ids") -> list[WorkerRef]:
    """The workers ``ids`` name, in order, without repeats: each a ``"<job>/<index>"``
    string or a dict with an ``"id"`` as :meth:`~tidal.client.Client.launch_workers`,
    ``await_workers`` and ``list_workers`` return them (Cloudera ML's worker dicts), in a
    list or not; :class:`WorkerArgumentError` naming ``argument`` (and the position) for a
    bad one."""
    items = _flat(ids)
    if not items:
        raise WorkerArgumentError(f"{argument}: expected at least one worker id, got none")
    found: list[WorkerRef] = []
    for i, item in enumerate(items):
        text = item.get("id") if isinstance(item, Mapping) else item
        match = _ID_RE.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise WorkerArgumentError(
                f"{argument}[{i}]: expected a worker id JOB/INDEX as launch_workers "
                f"returns it (e.g. 'workers-1a2b/0'), got {shown(item)}"
            )
        ref = WorkerRef(match.group(1), int(match.group(2)))
        if ref not in found:
            found.append(ref)
    return found


def command_of(
    script: str | None, command: str | Sequence[str] | None, code: str | None = None
) -> list[str] | str:
    """What the workers run: ``command`` as given, ``python <script>`` (the server's
    interpreter, the one tidal runs in), or ``python -c <code>``. ``script`` and ``code``
    together run the script (Cloudera ML ignores the code then); ``command`` goes with
    neither."""
    given = [name for name, v in (("script", script), ("code", code)) if v is not None]
    if command is not None and given:
        raise WorkerArgumentError(f"{given[0]}/command: give one of them, got both")
    if script is not None:
        if not isinstance(script, str) or not script.strip():
            raise WorkerArgumentError(
                f"script: expected a path to a Python file, got {shown(script)}"
            )
        return ["python", script]
    if code is not None:
        if not isinstance(code, str) or not code.strip():
            raise WorkerArgumentError(f"code: expected Python code to run, got {shown(code)}")
        return ["python", "-c", code]
    if command is None:
        raise WorkerArgumentError("script/command: give a script, code or a command, got none")
    if isinstance(command, str):
        if not command.strip():
            raise WorkerArgumentError("command: expected a command to run, got an empty string")
        return command
    parts = list(command or [])
    if not parts or not all(isinstance(p, str) for p in parts):
        raise WorkerArgumentError(
            f"command: expected a string or a non-empty list of strings, got {shown(command)}"
        )
    return parts


def memory_of(memory: Any) -> int:
    """Bytes from a worker's ``memory``: a number is GiB (``0.5`` → 512 MiB, as Cloudera
    ML counts it), a string has its unit (``"512Mi"``, ``"4Gi"``)."""
    if isinstance(memory, bool) or not isinstance(memory, int | float | str):
        raise WorkerArgumentError(
            f"memory: expected GiB (a number) or a size like 4Gi, got {shown(memory)}"
        )
    if isinstance(memory, int | float):
        if not math.isfinite(memory) or memory <= 0:
            raise WorkerArgumentError(f"memory: expected GiB > 0, got {memory}")
        memory = int(memory * _GIB)
    try:
        return parse_memory(memory)
    except ValueError as exc:
        raise WorkerArgumentError(f"memory: {exc}") from None


def _count(value: Any, argument: str, least: int, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise WorkerArgumentError(
            f"{argument}: expected an integer from {least} to {most}, got {shown(value)}"
        )
    return value


def _resources(cpu: Any, memory: Any, gpus: Any) -> dict[str, Any]:
    if isinstance(cpu, bool) or not isinstance(cpu, int | float) or not math.isfinite(cpu):
        raise WorkerArgumentError(f"cpu: expected a number of CPUs > 0, got {shown(cpu)}")
    if not 0 < cpu <= MAX_CPUS:
        raise WorkerArgumentError(f"cpu: expected a number of CPUs in (0, {MAX_CPUS:g}], got {cpu}")
    out: dict[str, Any] = {"cpus": float(cpu), "gpus": _count(gpus, "gpus", 0, 64)}
    if memory is not None:
        out["memory"] = memory_of(memory)
    return out


def _env(env: Mapping[str, str] | None) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise WorkerArgumentError(
            f"env: expected a mapping of strings to strings, got {shown(env)}"
        )
    return dict(env)


def _name(value: Any, argument: str) -> str:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise WorkerArgumentError(
            f"{argument}: expected 1-63 of a-z 0-9 _ . - starting with a letter or digit, "
            f"got {shown(value)}"
        )
    return value


def launch_spec(
    n: int,
    *,
    cpu: float = 1.0,
    memory: float | str | None = None,
    gpus: int = 0,
    script: str | None = None,
    command: str | Sequence[str] | None = None,
    code: str | None = None,
    env: Mapping[str, str] | None = None,
    role: str = "worker",
    name: str = "workers",
    working_dir: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The job spec of ``n`` fixed replicas of one role running ``command`` (or ``python
    script``, or ``python -c code``) in ``working_dir``; a failed replica is not restarted
    (it is reported, not replaced)."""
    replicas = _count(n, "n", 1, MAX_WORKERS)
    run = command_of(script, command, code)
    resources = _resources(cpu, memory, gpus)
    variables = _env(env)
    job_name = _name(name, "name")
    role_name = _name(role, "role")
    restart = {"max_restarts": 0}
    where = {} if working_dir is None else {"working_dir": working_dir}
    tags = {} if not labels else {"labels": dict(labels)}
    if role_name == "worker":
        return {
            "name": job_name,
            "command": run,
            "workers": replicas,
            "resources": resources,
            "env": variables,
            "restart": restart,
            **where,
            **tags,
        }
    return {
        "name": job_name,
        "restart": restart,
        **tags,
        "roles": [
            {
                "name": role_name,
                "command": run,
                "replicas": replicas,
                "resources": resources,
                "env": variables,
                **where,
            }
        ],
    }


def launched(spec: Mapping[str, Any] | None) -> int:
    """How many workers :func:`launch_spec` asked for in ``spec`` (0 if it did not)."""
    if not spec:
        return 0
    count = spec.get("workers")
    roles = spec.get("roles")
    if count is None and isinstance(roles, list) and len(roles) == 1:
        count = roles[0].get("replicas") if isinstance(roles[0], Mapping) else None
    return count if isinstance(count, int) and not isinstance(count, bool) else 0


#: Spec fields and the launch_workers argument that sets each.
_ARGUMENTS = (
    ("workers", "n"),
    ("replicas", "n"),
    ("resources.cpus", "cpu"),
    ("resources.memory", "memory"),
    ("resources.gpus", "gpus"),
    ("resources", "cpu/memory/gpus"),
    ("command", "command"),
    ("env", "env"),
    ("working_dir", "working_dir"),
    ("launcher", "launcher"),
    ("name", "name"),
)


def argument_problems(problems: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """A server's spec problems with each field path told as the argument that set it
    (``resources.cpus`` → ``cpu``; ``roles[0].resources.gpus`` → ``gpus``)."""
    out: list[tuple[str, str]] = []
    for path, message in problems:
        field = re.sub(r"^roles(\[\d+\]|\.[^.]+)\.", "", path)
        argument = next(
            (arg for spec, arg in _ARGUMENTS if field == spec or field.startswith(spec + ".")),
            path,
        )
        out.append((argument, message))
    return out


@dataclass(frozen=True)
class WorkerReport:
    """One worker as ``await_workers`` reports it."""

    id: str
    status: str
    host: str | None = None
    slot: int | None = None
    ip_address: str | None = None
    exit_code: int | None = None
    #: Whether the wait is over for this worker (up, or ended, as asked).
    settled: bool = False
    #: Whether it counts among the failures once the wait is over.
    failed: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The worker as ``await_workers`` returns it."""
        return {
            "id": self.id,
            "ip_address": self.ip_address,
            "host": self.host,
            "slot": self.slot,
            "status": self.status,
            "exit_code": self.exit_code,
        }


def _report(
    ref: WorkerRef, job: JobDetail, worker: WorkerView | None, completion: bool
) -> WorkerReport:
    if worker is None:
        # Not started yet: the job waits for slots, or it ended before this worker ran.
        over = job.state in _JOB_ENDED
        status = f"job {job.state}" if over else "queued"
        return WorkerReport(str(ref), status, settled=over, failed=over)
    ended = worker.state in ENDED_STATES or job.state in _JOB_ENDED
    succeeded = worker.state == "exited" and worker.exit_code in (0, None)
    if completion:
        settled, failed = ended, ended and not succeeded
    else:
        # A program that does not use tidal's runtime never joins a group, so it stays
        # ``starting`` while it runs: its process existing (a pid) is what "up" means.
        up = worker.state in STARTED_STATES or (
            worker.state == "starting" and worker.pid is not None
        )
        settled, failed = up or ended, ended and not succeeded
    return WorkerReport(
        str(ref),
        worker.state,
        host=worker.host,
        slot=worker.slot,
        ip_address=worker.ip_address,
        exit_code=worker.exit_code,
        settled=settled,
        failed=failed,
    )


def summarise(
    refs: Sequence[WorkerRef], jobs: Mapping[str, JobDetail], *, completion: bool
) -> list[WorkerReport]:
    """Each of ``refs`` as its job (in ``jobs``, by id) shows it now. Without
    ``completion`` a worker is settled once its program started (it is ``running``, or
    ``starting`` with a process id: a program that does not use tidal's runtime stays
    ``starting`` while it runs) or ended; with it, once its process is over. A worker
    settled by failing, being stopped, or never starting before its job ended is
    ``failed``."""
    out: list[WorkerReport] = []
    for ref in refs:
        job = jobs[ref.job]
        worker = next((w for w in job.worker_list if w.worker_id == ref.index), None)
        out.append(_report(ref, job, worker, completion))
    return out


def unknown_worker(ref: WorkerRef, job: JobDetail) -> str | None:
    """Why ``job`` has no worker ``ref`` (and never will), or ``None`` when it has or may.

    A job's first workers are ``0 .. max_slots - 1``; later ones (replacements) appear
    in its worker list.
    """
    known = {w.worker_id for w in job.worker_list}
    if ref.index in known or ref.index < job.max_slots:
        return None
    top = max(known | {job.max_slots - 1})
    return f"job {job.id} has no worker {ref.index} (its workers are 0-{top})"
