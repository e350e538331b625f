"""Kubeflow Trainer v2's TrainJob (``trainer.kubeflow.org/v1alpha1``) read as a tidal spec.

A TrainJob names a training runtime (``spec.runtimeRef``) and overrides its trainer inline
(``spec.trainer``: command, args, env, numNodes, numProcPerNode, resourcesPerNode). tidal
has no runtime objects: either the runtime's manifest is given as a local file
(:mod:`.runtime`; its ``node`` container and ``mlPolicy`` are the defaults the inline
trainer overrides, as Trainer merges them), or the runtime's name picks the launcher
(``torch-*`` → ``torchrun``, ``mpi-*`` and ``deepspeed-*`` → ``mpi``) and the trainer's
settings must all be given inline. The job becomes one role, ``node``, as Trainer names
the replicated job it runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tidal.compat.kube import (
    Draft,
    container_role,
    count,
    mapping,
    merge_labels,
    node_selector,
    warn_unknown,
)
from tidal.compat.runtime import Runtime, read_runtime
from tidal.spec_fields import shown

__all__ = ["API_VERSIONS", "NODE_ROLE", "RUNTIME_LAUNCHERS", "read_trainjob"]

API_VERSIONS = ("trainer.kubeflow.org/v1alpha1",)
NODE_ROLE = "node"
#: Runtime name prefixes and the launcher each stands for (Trainer's built-in runtimes).
RUNTIME_LAUNCHERS = (("torch", "torchrun"), ("mpi", "mpi"), ("deepspeed", "mpi"))
_TRAINER_FIELDS = {"command", "args", "env", "numNodes", "numProcPerNode", "resourcesPerNode"}


def _runtime(
    draft: Draft, spec: Mapping[str, Any], runtimes: Mapping[str, Mapping[str, Any]]
) -> tuple[str | None, Runtime | None]:
    """The launcher, and the runtime's defaults when its manifest was given."""
    ref = mapping(draft, spec.get("runtimeRef"), "spec.runtimeRef", required=True)
    warn_unknown(draft, ref, "spec.runtimeRef", {"name", "kind", "apiGroup"})
    name = ref.get("name")
    if not isinstance(name, str):
        if ref:
            draft.fail("spec.runtimeRef.name", f"required: the runtime's name (got {shown(name)})")
        return None, None
    if name in runtimes:
        runtime = read_runtime(draft, runtimes[name])
        return runtime.launcher or _launcher_by_name(draft, name), runtime
    if runtimes:
        given = ", ".join(sorted(runtimes))
        draft.fail("spec.runtimeRef.name", f"runtime {name!r} is not among those given ({given})")
        return None, None
    return _launcher_by_name(draft, name), None


def _launcher_by_name(draft: Draft, name: str) -> str | None:
    for prefix, launcher in RUNTIME_LAUNCHERS:
        if name.startswith(prefix):
            return launcher
    known = ", ".join(f"{p}-*" for p, _ in RUNTIME_LAUNCHERS)
    draft.fail("spec.runtimeRef.name", f"unknown runtime {name!r} (tidal knows {known})")
    return None


def _overrides(draft: Draft, value: Any, labels: dict[str, str]) -> None:
    """``podSpecOverrides``: their nodeSelector is honoured, nothing else."""
    if value is None:
        return
    if not isinstance(value, list):
        draft.fail("spec.podSpecOverrides", f"expected a list (got {shown(value)})")
        return
    for i, item in enumerate(value):
        path = f"spec.podSpecOverrides[{i}]"
        override = mapping(draft, item, path, required=True)
        warn_unknown(draft, override, path, {"targetJobs", "nodeSelector"})
        selector = node_selector(draft, override.get("nodeSelector"), f"{path}.nodeSelector")
        merge_labels(draft, labels, selector, f"{path}.nodeSelector")


def _container(trainer: Mapping[str, Any], runtime: Runtime | None) -> tuple[dict[str, Any], str]:
    """The node's container: the runtime's, with the trainer's fields over it (command and
    args each replace the runtime's, env is merged by name, resourcesPerNode replaces)."""
    given = {k: v for k, v in trainer.items() if k in ("command", "args", "env")} | (
        {"resources": trainer["resourcesPerNode"]} if "resourcesPerNode" in trainer else {}
    )
    if runtime is None or not runtime.container:
        return given, "spec.trainer"
    merged = {k: v for k, v in runtime.container.items() if k != "name"}
    env = merged.get("env")
    if isinstance(env, list) and isinstance(given.get("env"), list):
        names = {e.get("name") for e in given["env"] if isinstance(e, Mapping)}
        given["env"] = [
            e for e in env if not (isinstance(e, Mapping) and e.get("name") in names)
        ] + given["env"]
    merged.update(given)
    # Errors are named where the command came from.
    path = "spec.trainer" if {"command", "args"} & set(given) else runtime.container_path
    return merged, path


def read_trainjob(
    manifest: Mapping[str, Any], runtimes: Mapping[str, Mapping[str, Any]] | None = None
) -> Draft:
    """A TrainJob as a draft spec (see :class:`tidal.compat.kube.Draft`); ``runtimes``:
    runtime manifests by name (:func:`tidal.compat.runtime.runtimes_by_name`)."""
    draft = Draft()
    meta = mapping(draft, manifest.get("metadata"), "metadata", required=True)
    warn_unknown(draft, meta, "metadata", {"name", "labels", "namespace"})
    name = meta.get("name")
    if isinstance(name, str):
        draft.data["name"] = name
    else:
        draft.fail("metadata.name", f"required: the job's name (got {shown(name)})")
    if "namespace" in meta:
        draft.warn("metadata.namespace", "ignored: tidal has no namespaces")
    if meta.get("labels"):
        draft.data["labels"] = mapping(draft, meta["labels"], "metadata.labels")
    spec = mapping(draft, manifest.get("spec"), "spec", required=True)
    warn_unknown(draft, spec, "spec", {"runtimeRef", "trainer", "podSpecOverrides", "labels"})
    launcher, runtime = _runtime(draft, spec, runtimes or {})
    labels: dict[str, str] = dict(runtime.labels) if runtime is not None else {}
    _overrides(draft, spec.get("podSpecOverrides"), labels)
    trainer = mapping(draft, spec.get("trainer"), "spec.trainer", required=runtime is None)
    warn_unknown(draft, trainer, "spec.trainer", _TRAINER_FIELDS | {"image"})
    if "image" in trainer:
        draft.warn("spec.trainer.image", "ignored: tidal runs the command on its hosts")
    container, container_path = _container(trainer, runtime)
    role = container_role(draft, container, container_path) if container or trainer else None
    default_nodes = runtime.nodes if runtime is not None and runtime.nodes else 1
    nodes = count(draft, trainer.get("numNodes"), "spec.trainer.numNodes", default_nodes, 1)
    per_node = trainer.get("numProcPerNode")
    if per_node is not None:
        if isinstance(per_node, str) and per_node.isascii() and per_node.isdigit():
            per_node = int(per_node)
        if per_node not in (1, "auto", "cpu", "gpu"):
            draft.warn(
                "spec.trainer.numProcPerNode",
                f"ignored ({shown(per_node)}): tidal runs one process per replica; "
                "ask for that many nodes instead",
            )
    if role is None or nodes is None or launcher is None:
        return draft
    draft.origins[NODE_ROLE] = "spec.trainer"
    draft.data["roles"] = [
        {"name": NODE_ROLE, **role, "replicas": nodes, "launcher": launcher, "ends_job": True}
    ]
    if labels:
        draft.data["target"] = {"labels": labels}
    return draft
