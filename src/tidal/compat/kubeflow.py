"""Kubeflow's TFJob and PyTorchJob (``kubeflow.org/v1``, and ``v1beta2``, which differs only
in name) read as a tidal spec.

Each replica type becomes a role named after it in lower case (``Chief`` → ``chief``,
``PS`` → ``ps``), with the ``tf`` launcher for a TFJob and ``torchrun`` for a PyTorchJob:
``replicas``, ``restartPolicy``, and from the pod template the container's command and
args, env, workingDir, resource limits (``nvidia.com/gpu`` → GPUs per replica) and the
pod's ``nodeSelector`` (→ the job's host labels). A PyTorchJob's ``elasticPolicy`` makes its
Worker role elastic (``minReplicas:maxReplicas``). What tidal cannot honour is a warning
naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tidal.compat.kube import (
    RESTART_POLICIES,
    Draft,
    count,
    mapping,
    merge_labels,
    pod_template_role,
    warn_unknown,
)
from tidal.spec_fields import shown

__all__ = ["API_VERSIONS", "KINDS", "REPLICA_TYPES", "read_kubeflow_job"]

API_VERSIONS = ("kubeflow.org/v1", "kubeflow.org/v1beta2")


class _Kind:
    """What differs between TFJob and PyTorchJob."""

    def __init__(
        self,
        replicas_key: str,
        types: tuple[str, ...],
        launcher: str,
        container: str,
        default_restart: str,
        spec_fields: set[str],
    ) -> None:
        self.replicas_key = replicas_key
        self.types = types
        self.launcher = launcher
        self.container = container
        self.default_restart = default_restart
        self.spec_fields = spec_fields


#: The training operator's defaults: TFJob replicas restart ``Never``, PyTorchJob's
#: ``OnFailure``; the container it looks for is named ``tensorflow`` / ``pytorch``.
KINDS = {
    "TFJob": _Kind(
        "tfReplicaSpecs",
        ("Chief", "Master", "PS", "Worker", "Evaluator"),
        "tf",
        "tensorflow",
        "Never",
        {"tfReplicaSpecs", "runPolicy", "successPolicy", "enableDynamicWorker"},
    ),
    "PyTorchJob": _Kind(
        "pytorchReplicaSpecs",
        ("Master", "Worker"),
        "torchrun",
        "pytorch",
        "OnFailure",
        {"pytorchReplicaSpecs", "runPolicy", "elasticPolicy", "nprocPerNode"},
    ),
}
REPLICA_TYPES = {t for kind in KINDS.values() for t in kind.types}
_ELASTIC_FIELDS = {"minReplicas", "maxReplicas", "nProcPerNode", "maxRestarts"}


def _metadata(draft: Draft, manifest: Mapping[str, Any]) -> None:
    meta = mapping(draft, manifest.get("metadata"), "metadata", required=True)
    warn_unknown(draft, meta, "metadata", {"name", "labels", "namespace"})
    name = meta.get("name")
    if not isinstance(name, str):
        draft.fail("metadata.name", f"required: the job's name (got {shown(name)})")
    else:
        draft.data["name"] = name
    if "namespace" in meta:
        draft.warn("metadata.namespace", "ignored: tidal has no namespaces")
    labels = mapping(draft, meta.get("labels"), "metadata.labels")
    if labels:
        draft.data["labels"] = labels


def _run_policy(draft: Draft, spec: Mapping[str, Any]) -> None:
    policy = mapping(draft, spec.get("runPolicy"), "spec.runPolicy")
    warn_unknown(draft, policy, "spec.runPolicy", {"backoffLimit"})
    if "backoffLimit" in policy:
        limit = count(draft, policy["backoffLimit"], "spec.runPolicy.backoffLimit", 0)
        if limit is not None:
            draft.data["restart"] = {"max_restarts": limit}


def _replica_role(
    draft: Draft, kind: _Kind, rtype: str, data: Any, labels: dict[str, str]
) -> dict[str, Any] | None:
    path = f"spec.{kind.replicas_key}.{rtype}"
    replica = mapping(draft, data, path, required=True)
    warn_unknown(draft, replica, path, {"replicas", "restartPolicy", "template"})
    replicas = count(draft, replica.get("replicas"), f"{path}.replicas", 1)
    policy = replica.get("restartPolicy", kind.default_restart)
    if policy not in RESTART_POLICIES:
        draft.fail(
            f"{path}.restartPolicy",
            f"expected one of {', '.join(RESTART_POLICIES)} (got {shown(policy)})",
        )
    role = pod_template_role(
        draft, replica.get("template"), f"{path}.template", kind.container, labels
    )
    if role is None or replicas is None:
        return None
    if replicas == 0:
        draft.warn(f"{path}.replicas", f"0 replicas: no {rtype.lower()} role is run")
        return None
    draft.origins[rtype.lower()] = path
    return {
        "name": rtype.lower(),
        **role,
        "replicas": replicas,
        "restart": {"policy": policy},
        "launcher": kind.launcher,
    }


def _elastic(draft: Draft, spec: Mapping[str, Any], worker: dict[str, Any]) -> None:
    """A PyTorchJob's elasticPolicy and nprocPerNode, applied to its Worker role."""
    path = "spec.elasticPolicy"
    policy = mapping(draft, spec.get("elasticPolicy"), path)
    warn_unknown(draft, policy, path, _ELASTIC_FIELDS)
    fixed = worker["replicas"]
    low = count(draft, policy.get("minReplicas"), f"{path}.minReplicas", fixed, 1)
    high = count(draft, policy.get("maxReplicas"), f"{path}.maxReplicas", fixed, 1)
    if "maxRestarts" in policy:
        limit = count(draft, policy["maxRestarts"], f"{path}.maxRestarts", 0)
        if limit is not None:
            draft.data["restart"] = {"max_restarts": limit}
    nproc_path, nproc = (
        (f"{path}.nProcPerNode", policy["nProcPerNode"])
        if "nProcPerNode" in policy
        else ("spec.nprocPerNode", spec.get("nprocPerNode"))
    )
    per_node = _nproc(draft, nproc, nproc_path, worker["resources"].get("gpus", 0))
    if low is None or high is None or per_node is None:
        return
    if low > high:
        draft.fail(f"{path}.minReplicas", f"must be <= maxReplicas (got {low} > {high})")
        return
    if per_node > 1:
        # tidal runs one process per replica, each on its own slot: a node of N processes
        # is N replicas, and its GPUs are shared among them.
        gpus = worker["resources"].get("gpus", 0)
        if gpus % per_node:
            draft.fail(nproc_path, f"{gpus} GPUs per node do not split among {per_node} processes")
            return
        worker["resources"]["gpus"] = gpus // per_node
        draft.warn(
            nproc_path,
            f"{per_node} processes per node become {per_node} replicas of one process each",
        )
        low, high, fixed = low * per_node, high * per_node, fixed * per_node
    if policy:
        worker["replicas"] = {"min": low, "max": high, "initial": min(max(fixed, low), high)}
    else:
        worker["replicas"] = fixed


def _nproc(draft: Draft, value: Any, path: str, gpus: int) -> int | None:
    if value is None:
        return 1
    if isinstance(value, str):
        if value.isascii() and value.isdigit():
            value = int(value)
        elif value in ("auto", "gpu"):
            return max(gpus, 1)
        elif value == "cpu":
            draft.warn(path, "'cpu': one process per replica")
            return 1
    return count(draft, value, path, 1, 1)


def _success(
    kind_name: str, spec: Mapping[str, Any], roles: list[dict[str, Any]], draft: Draft
) -> None:
    """Kubeflow's successPolicy as ``ends_job``: the chief's (or master's) success, else
    all workers' (tidal waits for every worker, where Kubeflow's default takes worker 0)."""
    names = [r["name"] for r in roles]
    policy = spec.get("successPolicy", "")
    if policy not in ("", "AllWorkers"):
        draft.fail("spec.successPolicy", f"expected '' or AllWorkers (got {shown(policy)})")
    lead = next((n for n in ("chief", "master") if n in names), None)
    ends = lead if lead is not None and policy != "AllWorkers" else "worker"
    if ends not in names:
        ends = names[0] if names else ""
    for role in roles:
        role["ends_job"] = role["name"] == ends


def read_kubeflow_job(manifest: Mapping[str, Any]) -> Draft:
    """A TFJob or PyTorchJob as a draft spec (see :class:`tidal.compat.kube.Draft`)."""
    draft = Draft()
    kind = KINDS[str(manifest["kind"])]
    _metadata(draft, manifest)
    spec = mapping(draft, manifest.get("spec"), "spec", required=True)
    warn_unknown(draft, spec, "spec", kind.spec_fields)
    _run_policy(draft, spec)
    if spec.get("enableDynamicWorker"):
        draft.warn("spec.enableDynamicWorker", "ignored: only an elastic role changes size")
    replicas = mapping(
        draft, spec.get(kind.replicas_key), f"spec.{kind.replicas_key}", required=True
    )
    labels: dict[str, str] = {}
    roles: list[dict[str, Any]] = []
    unselected: list[str] = []
    for rtype, data in replicas.items():
        path = f"spec.{kind.replicas_key}.{rtype}"
        if rtype not in kind.types:
            draft.fail(
                path, f"unknown replica type (a {manifest['kind']} has {', '.join(kind.types)})"
            )
            continue
        own: dict[str, str] = {}
        role = _replica_role(draft, kind, rtype, data, own)
        merge_labels(draft, labels, own, f"{path}.template.spec.nodeSelector")
        if not own:
            unselected.append(path)
        if role is not None:
            roles.append(role)
    if labels:
        # tidal places a job by one set of host labels: a replica without a selector gets
        # the others' too. Said, not silently applied.
        for path in unselected:
            draft.warn(
                f"{path}.template.spec.nodeSelector",
                f"absent: this role also runs on hosts with {labels} (one set per job)",
            )
    if not roles and not draft.problems:
        draft.fail(f"spec.{kind.replicas_key}", "no replica to run")
    worker = next((r for r in roles if r["name"] == "worker"), None)
    if "elasticPolicy" in spec or "nprocPerNode" in spec:
        if "Worker" not in replicas:
            draft.fail("spec.elasticPolicy", "needs a Worker replica spec to resize")
        elif worker is not None:  # else its own problems are reported already
            _elastic(draft, spec, worker)
    _success(str(manifest["kind"]), spec, roles, draft)
    if labels:
        draft.data["target"] = {"labels": labels}
    draft.data["roles"] = roles
    return draft
