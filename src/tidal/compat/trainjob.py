"""Kubeflow Trainer v2's TrainJob (``trainer.kubeflow.org/v1alpha1``) read as a tidal spec.

A TrainJob names a training runtime (``spec.runtimeRef``) and overrides its trainer inline
(``spec.trainer``: command, args, env, numNodes, numProcPerNode, resourcesPerNode). tidal
has no runtime objects: the runtime's name picks the launcher (``torch-*`` → ``torchrun``,
``mpi-*`` and ``deepspeed-*`` → ``mpi``) and the trainer's settings must be given inline.
The job becomes one role, ``node``, as Trainer names the replicated job it runs.
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
from tidal.spec_fields import shown

__all__ = ["API_VERSIONS", "NODE_ROLE", "RUNTIME_LAUNCHERS", "read_trainjob"]

API_VERSIONS = ("trainer.kubeflow.org/v1alpha1",)
NODE_ROLE = "node"
#: Runtime name prefixes and the launcher each stands for (Trainer's built-in runtimes).
RUNTIME_LAUNCHERS = (("torch", "torchrun"), ("mpi", "mpi"), ("deepspeed", "mpi"))
_TRAINER_FIELDS = {"command", "args", "env", "numNodes", "numProcPerNode", "resourcesPerNode"}


def _launcher(draft: Draft, spec: Mapping[str, Any]) -> str | None:
    ref = mapping(draft, spec.get("runtimeRef"), "spec.runtimeRef", required=True)
    warn_unknown(draft, ref, "spec.runtimeRef", {"name", "kind", "apiGroup"})
    name = ref.get("name")
    if not isinstance(name, str):
        if ref:
            draft.fail("spec.runtimeRef.name", f"required: the runtime's name (got {shown(name)})")
        return None
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


def read_trainjob(manifest: Mapping[str, Any]) -> Draft:
    """A TrainJob as a draft spec (see :class:`tidal.compat.kube.Draft`)."""
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
    launcher = _launcher(draft, spec)
    labels: dict[str, str] = {}
    _overrides(draft, spec.get("podSpecOverrides"), labels)
    trainer = mapping(draft, spec.get("trainer"), "spec.trainer", required=True)
    warn_unknown(draft, trainer, "spec.trainer", _TRAINER_FIELDS | {"image"})
    if "image" in trainer:
        draft.warn("spec.trainer.image", "ignored: tidal runs the command on its hosts")
    container = {k: v for k, v in trainer.items() if k in ("command", "args", "env")} | (
        {"resources": trainer["resourcesPerNode"]} if "resourcesPerNode" in trainer else {}
    )
    role = container_role(draft, container, "spec.trainer") if trainer else None
    nodes = count(draft, trainer.get("numNodes"), "spec.trainer.numNodes", 1, 1)
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
