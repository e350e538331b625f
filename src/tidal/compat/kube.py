"""Kubernetes pieces shared by every manifest kind: containers, quantities, pod templates.

A manifest is read into a *draft*: the plain data of a tidal spec (``tidal.spec``'s
form), plus the warnings and problems found on the way, each naming the manifest's field
path. Nothing here raises for bad input: problems are collected so one round trip shows
them all, and :mod:`tidal.compat` refuses the manifest if there are any.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tidal.spec_fields import parse_memory, shown

__all__ = [
    "RESTART_POLICIES",
    "Draft",
    "container_role",
    "count",
    "cpu_quantity",
    "mapping",
    "merge_labels",
    "node_selector",
    "pod_container",
    "pod_template_role",
    "warn_unknown",
]

#: Kubeflow's restart policies (tidal's spec spells them the same way).
RESTART_POLICIES = ("Never", "OnFailure", "Always", "ExitCode")
_GPU_KEYS = ("nvidia.com/gpu", "amd.com/gpu")
_CPU_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(m?)")
#: Container fields a tidal role takes over; every other one is reported as not honoured.
_CONTAINER_FIELDS = {"name", "command", "args", "env", "workingDir", "resources"}
#: Why a field a role cannot take over is left out, by field (the default for the rest).
_WHY = {
    "image": "tidal runs the command on its hosts, not in a container image",
    "imagePullPolicy": "tidal pulls no images",
    "volumeMounts": "tidal mounts no volumes: use paths on the hosts",
    "volumes": "tidal mounts no volumes: use paths on the hosts",
    "securityContext": "processes run as the tidal server's user",
    "ports": "tidal allocates ports for the launcher",
}


@dataclass
class Draft:
    """A manifest on its way to a spec: the spec's data, and what was found on the way."""

    data: dict[str, Any] = field(default_factory=dict)
    warnings: list[tuple[str, str]] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)
    #: The manifest path each of ``data["roles"]`` came from, by role name.
    origins: dict[str, str] = field(default_factory=dict)

    def warn(self, path: str, message: str) -> None:
        """Record a field tidal reads but cannot honour."""
        self.warnings.append((path, message))

    def fail(self, path: str, message: str) -> None:
        """Record a field that makes the manifest unusable."""
        self.problems.append((path, message))


def warn_unknown(draft: Draft, data: Mapping[str, Any], path: str, known: set[str]) -> None:
    """A warning for every key of ``data`` not in ``known``: it is read, not honoured."""
    for key in data:
        if key not in known:
            why = _WHY.get(str(key), "not honoured by tidal")
            draft.warn(f"{path}.{key}", f"ignored: {why}")


def mapping(draft: Draft, value: Any, path: str, *, required: bool = False) -> dict[str, Any]:
    """``value`` if it is a mapping; else a problem (when given, or ``required``) and ``{}``."""
    if isinstance(value, Mapping):
        return dict(value)
    if value is not None or required:
        got = "nothing" if value is None else shown(value)
        draft.fail(path, f"expected a mapping (got {got})")
    return {}


def count(draft: Draft, value: Any, path: str, default: int, least: int = 0) -> int | None:
    """An integer ``>= least`` (``default`` when absent), or ``None`` with a problem."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        draft.fail(path, f"expected an integer >= {least} (got {shown(value)})")
        return None
    return value


def cpu_quantity(value: Any) -> float:
    """CPUs from a Kubernetes quantity (``2``, ``"500m"``, ``"1.5"``); ``ValueError`` else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        amount = float(value)
    elif isinstance(value, str) and (match := _CPU_RE.fullmatch(value.strip())):
        amount = float(match.group(1)) / (1000 if match.group(2) else 1)
    else:
        raise ValueError(f"not a CPU quantity (got {shown(value)}; use e.g. 2 or 500m)")
    if not math.isfinite(amount) or amount <= 0:
        raise ValueError(f"must be a positive number of CPUs (got {shown(value)})")
    return amount


def _gpus(draft: Draft, value: Any, path: str) -> int | None:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    return count(draft, value, path, 0)


def _resources(draft: Draft, data: Any, path: str) -> dict[str, Any]:
    """A tidal ``resources`` section from ``{limits, requests}`` (limits win)."""
    section = mapping(draft, data, path)
    warn_unknown(draft, section, path, {"limits", "requests"})
    limits = mapping(draft, section.get("limits"), f"{path}.limits")
    requests = mapping(draft, section.get("requests"), f"{path}.requests")
    out: dict[str, Any] = {"gpus": 0}
    for source, values in (("requests", requests), ("limits", limits)):
        for key, value in values.items():
            where = f"{path}.{source}.{key}"
            if key in _GPU_KEYS:
                gpus = _gpus(draft, value, where)
                if gpus is not None:
                    out["gpus"] = gpus
            elif key == "cpu":
                try:
                    out["cpus"] = cpu_quantity(value)
                except ValueError as exc:
                    draft.fail(where, str(exc))
            elif key == "memory":
                try:
                    out["memory"] = parse_memory(value)
                except ValueError as exc:
                    draft.fail(where, str(exc))
            else:
                draft.warn(where, "ignored: tidal schedules GPUs, CPUs and memory only")
    return out


def _env(draft: Draft, data: Any, path: str) -> dict[str, str]:
    if data is None:
        return {}
    if not isinstance(data, list):
        draft.fail(path, f"expected a list of {{name, value}} (got {shown(data)})")
        return {}
    env: dict[str, str] = {}
    for i, item in enumerate(data):
        where = f"{path}[{i}]"
        entry = mapping(draft, item, where, required=True)
        name, value = entry.get("name"), entry.get("value", "")
        if not isinstance(name, str):
            draft.fail(f"{where}.name", f"expected a string (got {shown(name)})")
        elif "valueFrom" in entry:
            draft.warn(f"{where}.valueFrom", f"ignored: {name} is not set (no secrets or fields)")
        elif not isinstance(value, str):
            draft.fail(f"{where}.value", f"expected a string (got {shown(value)})")
        else:
            env[name] = value
    return env


def _words(draft: Draft, data: Any, path: str) -> list[str]:
    if data is None:
        return []
    if not isinstance(data, list) or not all(isinstance(w, str) for w in data):
        draft.fail(path, f"expected a list of strings (got {shown(data)})")
        return []
    return list(data)


def container_role(draft: Draft, container: Mapping[str, Any], path: str) -> dict[str, Any] | None:
    """A role's ``command``, ``env``, ``working_dir`` and ``resources`` from a container.

    ``None`` (with a problem) when the container has no command: tidal runs no images, so
    it cannot know an image's entrypoint.
    """
    warn_unknown(draft, container, path, _CONTAINER_FIELDS)
    command = _words(draft, container.get("command"), f"{path}.command")
    command += _words(draft, container.get("args"), f"{path}.args")
    role: dict[str, Any] = {
        "env": _env(draft, container.get("env"), f"{path}.env"),
        "resources": _resources(draft, container.get("resources"), f"{path}.resources"),
    }
    working_dir = container.get("workingDir")
    if working_dir is not None:
        if isinstance(working_dir, str):
            role["working_dir"] = working_dir
        else:
            draft.fail(f"{path}.workingDir", f"expected a string (got {shown(working_dir)})")
    if not command:
        if "command" not in container and "args" not in container:
            draft.fail(
                f"{path}.command",
                "required: tidal runs no container images, so it needs the command to run",
            )
        return None
    role["command"] = command
    return role


def node_selector(draft: Draft, value: Any, path: str) -> dict[str, str]:
    """Host labels from a ``nodeSelector``; merged into the job's by the caller."""
    labels = mapping(draft, value, path)
    out: dict[str, str] = {}
    for key, text in labels.items():
        if isinstance(text, str):
            out[str(key)] = text
        else:
            draft.fail(f"{path}.{key}", f"expected a string (got {shown(text)})")
    return out


def merge_labels(draft: Draft, labels: dict[str, str], more: dict[str, str], path: str) -> None:
    """Add ``more`` to a job's host labels; a label asked with two values is a problem
    (tidal places a job by one set of labels)."""
    for key, value in more.items():
        if labels.get(key, value) != value:
            draft.fail(
                f"{path}.{key}",
                f"{value!r} differs from {labels[key]!r} asked by another replica: "
                "tidal places a whole job by one set of host labels",
            )
        labels[key] = value


def pod_template_role(
    draft: Draft, template: Any, path: str, container_name: str, labels: dict[str, str]
) -> dict[str, Any] | None:
    """A role from a pod template: its container named ``container_name`` (or its only
    one); the pod's ``nodeSelector`` goes into ``labels``. ``None`` when it has problems."""
    found = pod_container(draft, template, path, container_name, labels)
    return None if found is None else container_role(draft, *found)


def pod_container(
    draft: Draft, template: Any, path: str, container_name: str, labels: dict[str, str]
) -> tuple[dict[str, Any], str] | None:
    """A pod template's container named ``container_name`` (or its first), as written, with
    its path; the pod's ``nodeSelector`` goes into ``labels``. ``None`` when it has none."""
    pod = mapping(draft, template, path, required=True)
    warn_unknown(draft, pod, path, {"spec", "metadata"})
    if pod.get("metadata"):
        draft.warn(f"{path}.metadata", "ignored: tidal sets no pod labels or annotations")
    spec = mapping(draft, pod.get("spec"), f"{path}.spec", required=True)
    warn_unknown(draft, spec, f"{path}.spec", {"containers", "nodeSelector"})
    merge_labels(
        draft,
        labels,
        node_selector(draft, spec.get("nodeSelector"), f"{path}.spec.nodeSelector"),
        f"{path}.spec.nodeSelector",
    )
    containers = spec.get("containers")
    where = f"{path}.spec.containers"
    if not isinstance(containers, list) or not containers:
        draft.fail(where, "required: a list with the container to run")
        return None
    names = [c.get("name") if isinstance(c, Mapping) else None for c in containers]
    index = names.index(container_name) if container_name in names else 0
    for i, name in enumerate(names):
        if i != index:
            draft.warn(
                f"{where}[{i}]",
                f"ignored: tidal runs one process per replica (container {name!r} not run)",
            )
    container = mapping(draft, containers[index], f"{where}[{index}]", required=True)
    return container, f"{where}[{index}]"
