"""A tidal job written back as a Kubeflow manifest: ``tidal export JOB --as KIND``.

The inverse of the translations in :mod:`tidal.compat`: reading the manifest written here
gives back the same job (roles, commands, env, working dirs, resources, replica ranges,
restart policies, success policy, host labels). What a manifest kind cannot say is a
warning; a role the kind has no replica type for is a :class:`~tidal.spec.SpecError`.
"""

from __future__ import annotations

from typing import Any

from tidal.compat.trainjob import NODE_ROLE
from tidal.model import Job, Launcher, Role, job_from_spec
from tidal.spec import JobSpec, RestartSpec, SpecError

__all__ = ["EXPORT_KINDS", "export_manifest"]

EXPORT_KINDS = ("tfjob", "pytorchjob", "trainjob")
#: The restart limit of a job that set none (written as no ``runPolicy.backoffLimit``).
DEFAULT_MAX_RESTARTS: int = RestartSpec.model_fields["max_restarts"].default
_TF_TYPES = {
    "chief": "Chief",
    "master": "Master",
    "ps": "PS",
    "worker": "Worker",
    "evaluator": "Evaluator",
}
_TORCH_TYPES = {"master": "Master", "worker": "Worker"}
_RUNTIMES = {Launcher.MPI: "mpi-distributed"}


def _limits(role: Role) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if role.resources.gpus:
        limits["nvidia.com/gpu"] = role.resources.gpus
    if role.resources.cpus is not None:
        limits["cpu"] = role.resources.cpus
    if role.resources.memory is not None:
        limits["memory"] = role.resources.memory
    return limits


def _container(role: Role, name: str, image: str | None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name}
    if image is not None:
        container["image"] = image
    container["command"] = list(role.command)
    if role.env:
        container["env"] = [{"name": k, "value": v} for k, v in role.env.items()]
    if role.working_dir is not None:
        container["workingDir"] = role.working_dir
    limits = _limits(role)
    if limits:
        container["resources"] = {"limits": limits}
    return container


def _replica(job: Job, role: Role, container: str, image: str | None) -> dict[str, Any]:
    pod: dict[str, Any] = {"containers": [_container(role, container, image)]}
    if job.placement.labels:
        pod["nodeSelector"] = dict(job.placement.labels)
    return {
        "replicas": role.replicas.initial,
        "restartPolicy": role.restart.policy.value,
        "template": {"spec": pod},
    }


def _metadata(job: Job) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": job.name}
    if job.labels:
        meta["labels"] = dict(job.labels)
    return meta


def _check_types(job: Job, types: dict[str, str], kind: str) -> None:
    bad = [r for r in job.roles if r.name not in types]
    if bad:
        names = ", ".join(types)
        raise SpecError(
            [
                (f"roles.{r.name}", f"a {kind} has no replica type for this role ({names})")
                for r in bad
            ]
        )


def _launcher_warnings(job: Job, launcher: Launcher, kind: str) -> list[tuple[str, str]]:
    return [
        (
            f"roles.{r.name}.launcher",
            f"{r.launcher.value!r} becomes {launcher.value!r} in a {kind}",
        )
        for r in job.roles
        if r.launcher is not launcher
    ]


def _kubeflow(
    job: Job, kind: str, image: str | None, restarts: int
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    tf = kind == "TFJob"
    types = _TF_TYPES if tf else _TORCH_TYPES
    _check_types(job, types, kind)
    launcher = Launcher.TF if tf else Launcher.TORCHRUN
    warnings = _launcher_warnings(job, launcher, kind)
    container = "tensorflow" if tf else "pytorch"
    spec: dict[str, Any] = {}
    if restarts != DEFAULT_MAX_RESTARTS:
        # tidal's default limit is no choice of the user's: a manifest read without a
        # backoffLimit is written back without one.
        spec["runPolicy"] = {"backoffLimit": restarts}
    elastic = [r for r in job.roles if r.replicas.elastic]
    for role in elastic:
        if tf:
            warnings.append(
                (
                    f"roles.{role.name}.replicas",
                    f"a TFJob has no elastic range: {role.replicas.initial} replicas",
                )
            )
        elif role.name == "worker":
            spec["elasticPolicy"] = {
                "minReplicas": role.replicas.min,
                "maxReplicas": role.replicas.max,
            }
    ends = [r.name for r in job.roles if r.ends_job]
    if tf and "chief" in types and "chief" in [r.name for r in job.roles] and ends == ["worker"]:
        spec["successPolicy"] = "AllWorkers"
    spec["tfReplicaSpecs" if tf else "pytorchReplicaSpecs"] = {
        types[r.name]: _replica(job, r, container, image) for r in job.roles
    }
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": kind,
        "metadata": _metadata(job),
        "spec": spec,
    }
    return manifest, warnings


def _trainjob(job: Job, image: str | None) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    if len(job.roles) != 1:
        raise SpecError([("roles", "a TrainJob runs one replicated role; this job has several")])
    role = job.roles[0]
    warnings: list[tuple[str, str]] = []
    if role.replicas.elastic:
        warnings.append(
            (
                f"roles.{role.name}.replicas",
                f"a TrainJob has no elastic range: {role.replicas.initial} nodes",
            )
        )
    if role.name != NODE_ROLE:
        warnings.append((f"roles.{role.name}", f"the role is named {NODE_ROLE!r} in a TrainJob"))
    if role.restart.policy.value != "OnFailure":
        warnings.append((f"roles.{role.name}.restart.policy", "a TrainJob restarts OnFailure"))
    trainer: dict[str, Any] = {}
    if image is not None:
        trainer["image"] = image
    trainer["command"] = list(role.command)
    if role.env:
        trainer["env"] = [{"name": k, "value": v} for k, v in role.env.items()]
    trainer["numNodes"] = role.replicas.initial
    limits = _limits(role)
    if limits:
        trainer["resourcesPerNode"] = {"limits": limits}
    if role.working_dir is not None:
        warnings.append(
            (f"roles.{role.name}.working_dir", "a TrainJob's trainer has no working dir")
        )
    spec: dict[str, Any] = {
        "runtimeRef": {"name": _RUNTIMES.get(role.launcher, "torch-distributed")},
        "trainer": trainer,
    }
    if job.placement.labels:
        spec["podSpecOverrides"] = [
            {"targetJobs": [{"name": NODE_ROLE}], "nodeSelector": dict(job.placement.labels)}
        ]
    manifest = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": _metadata(job),
        "spec": spec,
    }
    return manifest, warnings


def export_manifest(
    spec: JobSpec, kind: str, image: str | None = None
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """``spec`` as a manifest of ``kind`` (``tfjob``, ``pytorchjob``, ``trainjob``), and
    what the manifest cannot say (``(spec field path, message)``).

    ``image`` is written as each container's image (Kubernetes needs one; tidal does not).
    """
    job = job_from_spec(spec)
    common: list[tuple[str, str]] = []
    if job.placement.group is not None:
        common.append(("target.group", "a manifest has no resource group: use a nodeSelector"))
    if kind == "tfjob":
        manifest, warnings = _kubeflow(job, "TFJob", image, spec.restart.max_restarts)
    elif kind == "pytorchjob":
        manifest, warnings = _kubeflow(job, "PyTorchJob", image, spec.restart.max_restarts)
    elif kind == "trainjob":
        manifest, warnings = _trainjob(job, image)
    else:
        raise SpecError([("--as", f"expected one of {', '.join(EXPORT_KINDS)} (got {kind!r})")])
    return manifest, common + warnings
