"""What a server can run: the one place a job the spec allows, but this server's backend
cannot run, is refused before anything is stored.

A spec may describe more than a backend runs (a launcher it lacks, several roles on a
backend that runs one group), a replica wider than any host (:func:`too_wide`), or a
worker asking more CPUs or memory than any host has (:func:`too_big`).
Accepting such a job would leave it queued or failing for good, so ``POST /jobs`` (and
``/jobs/validate``) refuse it with a 422 naming the role and field.
A backend says what it runs with a :class:`Capabilities` (its ``capabilities``
attribute); one that says nothing runs what :data:`LOCAL` lists (the local backend).

Where the workers see the server's files (``shared_files``: the local backend), a working
dir or a ``python FILE`` script that is not there is refused too (:func:`missing_files`),
instead of failing every restart of the job later; a backend whose workers run on other
machines is not refused for paths this host lacks. There too, a script written for
torchrun submitted under tidal's launcher gets a warning (:func:`torchrun_hints`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from tidal.backends.base import LOCAL, ONE_GROUP, Capabilities
from tidal.controller.cluster import ClusterModel
from tidal.launch.limits import format_bytes
from tidal.model import Job, Launcher, RestartKind, Role

__all__ = [
    "LOCAL",
    "ONE_GROUP",
    "Capabilities",
    "capabilities_of",
    "entry_script",
    "missing_files",
    "too_big",
    "too_wide",
    "torchrun_hints",
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


def too_big(job: Job, cluster: ClusterModel, *, named_roles: bool = True) -> list[tuple[str, str]]:
    """Every ``(field path, message)`` for a role whose one worker asks more CPUs or
    memory than any host ``job`` may run on has (hosts that do not report them are not
    held against it)."""
    largest = cluster.largest(job.placement.group, job.placement.labels)
    if largest is None:
        return []
    problems: list[tuple[str, str]] = []
    for role in job.roles:
        where = f"roles.{role.name}." if named_roles else ""
        cpus, memory = role.resources.cpus, role.resources.memory
        if largest.cpus is not None and cpus is not None and cpus > largest.cpus:
            problems.append(
                (
                    f"{where}resources.cpus",
                    f"{cpus:g} CPUs per worker: the largest host this job may run on has "
                    f"{largest.cpus:g}",
                )
            )
        if largest.memory is not None and memory is not None and memory > largest.memory:
            problems.append(
                (
                    f"{where}resources.memory",
                    f"{format_bytes(memory)} per worker: the largest host this job may run "
                    f"on has {format_bytes(largest.memory)}",
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


#: ``python``, ``python3``, ``python3.11``, a path ending in one of them.
_PYTHON = re.compile(r"(?:.*/)?python(?:\d+(?:\.\d+)*)?")
#: Python's options that take the next argument as their value.
_PYTHON_VALUED = frozenset({"-W", "-X", "--check-hash-based-pycs"})


def entry_script(command: Sequence[str]) -> str | None:
    """The script file ``command`` runs, as written: ``FILE`` of ``python [OPTIONS] FILE``,
    or the program itself when written as a path (``./train.sh``); ``None`` when it runs
    no file (``python -m MOD``, ``python -c CODE``, a program found on ``PATH``)."""
    if not command:
        return None
    program = command[0]
    if not _PYTHON.fullmatch(program):
        return program if "/" in program else None
    skip = False
    for arg in command[1:]:
        if skip:
            skip = False
        elif arg in ("-m", "-c", "-") or arg.startswith(("-m", "-c")):
            return None  # a module, code or stdin: no file to look for
        elif arg in _PYTHON_VALUED:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def missing_files(job: Job, *, named_roles: bool = True) -> list[tuple[str, str]]:
    """Every ``(field path, message)`` for a role whose working dir, or whose script
    (:func:`entry_script`), is not on this host. Call it only where the workers run here
    (``Capabilities.shared_files``)."""
    problems: list[tuple[str, str]] = []
    for role in job.roles:
        where = f"roles.{role.name}." if named_roles else ""
        folder = role.working_dir
        if folder is not None and not os.path.isdir(folder):
            what = "not a directory" if os.path.exists(folder) else "no such directory"
            problems.append((f"{where}working_dir", f"{what} on the server's host: {folder}"))
            continue
        script = entry_script(role.command)
        if script is None or (folder is None and not os.path.isabs(script)):
            continue  # relative to a folder the worker is not told of: not checked
        path = os.path.join(folder or "", script)
        if not os.path.isfile(path):
            problems.append((f"{where}command", f"no such file on the server's host: {path}"))
    return problems


#: Bytes of a script read for :func:`torchrun_hints` (the set-up is near the top).
_SCRIPT_BYTES = 256 * 1024
#: What a script written for torchrun does: joins through ``env://``, or reads its rank.
_TORCHRUN_STYLE = re.compile(
    r"init_process_group\(|os\.environ\[[\"'](?:LOCAL_RANK|RANK|WORLD_SIZE)[\"']\]"
)
#: A script that uses tidal's runtime forms its group through it.
_TIDAL_RUNTIME = re.compile(r"^\s*(?:import tidal|from tidal\b)", re.MULTILINE)


def torchrun_hints(job: Job, *, named_roles: bool = True) -> list[tuple[str, str]]:
    """A ``(field path, warning)`` for each ``tidal``-launcher role whose script looks
    written for torchrun (it calls ``init_process_group`` or reads ``RANK`` and does not
    use :mod:`tidal.runtime`): under tidal's launcher torchrun's variables are not set.
    A warning, not a refusal: the look may deceive. Call it where the files are here."""
    hints: list[tuple[str, str]] = []
    for role in job.roles:
        if role.launcher is not Launcher.TIDAL:
            continue
        script = entry_script(role.command)
        if script is None or (role.working_dir is None and not os.path.isabs(script)):
            continue
        try:
            with open(os.path.join(role.working_dir or "", script), "rb") as file:
                text = file.read(_SCRIPT_BYTES).decode("utf-8", errors="replace")
        except OSError:
            continue
        if _TORCHRUN_STYLE.search(text) and not _TIDAL_RUNTIME.search(text):
            where = f"roles.{role.name}." if named_roles else ""
            hints.append(
                (
                    f"{where}launcher",
                    f"{script} looks written for torchrun (init_process_group, RANK) and does "
                    "not use tidal.runtime: submit it with --launcher torchrun "
                    "(launcher: torchrun), or it fails with 'environment variable RANK "
                    "expected, but not set'",
                )
            )
    return hints
