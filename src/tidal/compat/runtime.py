"""Kubeflow Trainer's training runtimes (``ClusterTrainingRuntime``, ``TrainingRuntime``)
read from local files, as the defaults a TrainJob's ``spec.trainer`` overrides.

A TrainJob names its runtime (``spec.runtimeRef.name``); in Kubernetes the runtime is an
object in the cluster. tidal has no such objects: the user passes the runtime's manifest
file (``tidal submit trainjob.yaml --runtime torch-distributed.yaml``). From it tidal takes
the launcher (``mlPolicy.torch`` → ``torchrun``, ``mlPolicy.mpi`` → ``mpi``), the node
count (``mlPolicy.numNodes``) and the ``node`` container of the ``node`` replicated job
(command, args, env, resources, workingDir, the pod's nodeSelector). Paths in warnings
and errors start with ``runtimes.<name>.``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidal.compat.kube import Draft, count, mapping, pod_container, warn_unknown
from tidal.spec_fields import shown

__all__ = ["RUNTIME_API_VERSIONS", "RUNTIME_KINDS", "Runtime", "read_runtime", "runtimes_by_name"]

RUNTIME_API_VERSIONS = ("trainer.kubeflow.org/v1alpha1",)
RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
#: The replicated job (and its container) that runs the training nodes, as Trainer names it.
NODE = "node"
#: Replicated jobs Trainer's built-in runtimes add beside the nodes, run by tidal itself.
_HELPER_JOBS = {"dataset-initializer", "model-initializer", "launcher"}
#: What a role takes from the node container (the rest is warned about where it is written).
_CONTAINER_FIELDS = {"name", "command", "args", "env", "workingDir", "resources"}


@dataclass
class Runtime:
    """What a runtime gives a TrainJob: each is ``None``/empty when the runtime is silent."""

    name: str
    #: The ``node`` container as written (command, args, env, resources, workingDir).
    container: dict[str, Any] = field(default_factory=dict)
    container_path: str = ""
    nodes: int | None = None
    launcher: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


def runtimes_by_name(documents: Iterable[tuple[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Runtime manifests by ``metadata.name``, from ``(source, document)`` pairs.

    Raises ``ValueError`` naming the source for a document that is not a runtime, has no
    name, or repeats another's name.
    """
    found: dict[str, Mapping[str, Any]] = {}
    for source, document in documents:
        if not isinstance(document, Mapping) or document.get("kind") not in RUNTIME_KINDS:
            kind = document.get("kind") if isinstance(document, Mapping) else None
            raise ValueError(
                f"{source}: kind: expected {' or '.join(RUNTIME_KINDS)} (got {shown(kind)})"
            )
        if document.get("apiVersion") not in RUNTIME_API_VERSIONS:
            raise ValueError(
                f"{source}: apiVersion: expected {', '.join(RUNTIME_API_VERSIONS)} "
                f"(got {shown(document.get('apiVersion'))})"
            )
        meta = document.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ValueError(f"{source}: metadata.name: required: the runtime's name")
        if name in found:
            raise ValueError(f"{source}: metadata.name: runtime {name!r} is given twice")
        found[name] = document
    return found


def _launcher(draft: Draft, policy: Mapping[str, Any], path: str) -> str | None:
    warn_unknown(draft, policy, path, {"numNodes", "torch", "mpi"})
    if "torch" in policy:
        torch = mapping(draft, policy["torch"], f"{path}.torch")
        warn_unknown(draft, torch, f"{path}.torch", {"numProcPerNode"})
        return "torchrun"
    if "mpi" in policy:
        mpi = mapping(draft, policy["mpi"], f"{path}.mpi")
        warn_unknown(draft, mpi, f"{path}.mpi", {"numProcPerNode", "mpiImplementation"})
        return "mpi"
    return None


def read_runtime(draft: Draft, manifest: Mapping[str, Any]) -> Runtime:
    """The defaults ``manifest`` (a runtime found by :func:`runtimes_by_name`) gives."""
    name = str(manifest["metadata"]["name"])
    root = f"runtimes.{name}"
    runtime = Runtime(name)
    spec = mapping(draft, manifest.get("spec"), f"{root}.spec", required=True)
    warn_unknown(draft, spec, f"{root}.spec", {"mlPolicy", "template"})
    policy = mapping(draft, spec.get("mlPolicy"), f"{root}.spec.mlPolicy")
    runtime.launcher = _launcher(draft, policy, f"{root}.spec.mlPolicy")
    if "numNodes" in policy:
        runtime.nodes = count(draft, policy["numNodes"], f"{root}.spec.mlPolicy.numNodes", 1, 1)
    template = mapping(draft, spec.get("template"), f"{root}.spec.template", required=True)
    jobs_path = f"{root}.spec.template.spec.replicatedJobs"
    jobs = mapping(draft, template.get("spec"), f"{root}.spec.template.spec").get("replicatedJobs")
    if not isinstance(jobs, list):
        draft.fail(jobs_path, f"expected a list with the {NODE!r} job (got {shown(jobs)})")
        return runtime
    names = [j.get("name") if isinstance(j, Mapping) else None for j in jobs]
    if NODE not in names:
        draft.fail(jobs_path, f"no replicated job named {NODE!r} (got {shown(names)})")
        return runtime
    for i, other in enumerate(names):
        if other != NODE:
            why = "tidal starts the processes itself" if other in _HELPER_JOBS else "not run"
            draft.warn(f"{jobs_path}[{i}]", f"ignored: replicated job {other!r}: {why}")
    index = names.index(NODE)
    job_path = f"{jobs_path}[{index}]"
    job = mapping(draft, jobs[index], job_path, required=True)
    warn_unknown(draft, job, job_path, {"name", "template", "replicas"})
    # A JobSet's replicated job holds a Job template whose spec holds the pod template.
    job_template = mapping(draft, job.get("template"), f"{job_path}.template")
    warn_unknown(draft, job_template, f"{job_path}.template", {"spec"})
    job_spec = mapping(draft, job_template.get("spec"), f"{job_path}.template.spec")
    warn_unknown(draft, job_spec, f"{job_path}.template.spec", {"template"})
    found = pod_container(
        draft, job_spec.get("template"), f"{job_path}.template.spec.template", NODE, runtime.labels
    )
    if found is not None:
        container, runtime.container_path = found
        # Fields a role cannot take (image, ports, ...) are reported here, where they are
        # written, whatever the TrainJob overrides; the rest are the defaults.
        warn_unknown(draft, container, runtime.container_path, _CONTAINER_FIELDS)
        runtime.container = {k: v for k, v in container.items() if k in _CONTAINER_FIELDS}
    return runtime
