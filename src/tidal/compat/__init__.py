"""Jobs as other systems write them: Kubeflow manifests read as (and written from) tidal specs.

:func:`spec_from_document` is what ``tidal submit``, ``POST /jobs`` and the SDK call on a
parsed document: a mapping with ``apiVersion``/``kind`` is a manifest, translated by the
module for its kind (:mod:`.kubeflow`: TFJob, PyTorchJob; :mod:`.trainjob`: TrainJob);
anything else is a tidal spec. Translation is pure: it returns the spec and the warnings
(``(field path, message)``: each manifest field tidal read but cannot honour), or raises
:class:`tidal.spec.SpecError` naming every field at fault. :mod:`.export` goes the other way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tidal.compat import kubeflow, runtime, trainjob
from tidal.compat.kube import Draft
from tidal.documents import load_yaml
from tidal.documents_bounds import SPEC_LIMITS, DocumentError
from tidal.spec import JobSpec, SpecError, parse_spec
from tidal.spec_fields import shown

__all__ = [
    "MANIFEST_KINDS",
    "is_manifest",
    "load_file",
    "spec_from_document",
    "translate_manifest",
]

#: Every kind read, with the apiVersions it is read in.
MANIFEST_KINDS: dict[str, tuple[str, ...]] = {
    "TFJob": kubeflow.API_VERSIONS,
    "PyTorchJob": kubeflow.API_VERSIONS,
    "TrainJob": trainjob.API_VERSIONS,
}
_ROLE_PATH = re.compile(r"roles\[([0-9]+)\]\.?(.*)")


def is_manifest(data: Any) -> bool:
    """Whether a parsed document is a Kubernetes-style manifest rather than a tidal spec."""
    return isinstance(data, Mapping) and ("apiVersion" in data or "kind" in data)


def _kind_problems(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    kind, version = data.get("kind"), data.get("apiVersion")
    known = "; ".join(f"{k} ({', '.join(v)})" for k, v in MANIFEST_KINDS.items())
    if kind not in MANIFEST_KINDS:
        return [("kind", f"unknown kind {shown(kind)} (tidal reads {known})")]
    if version not in MANIFEST_KINDS[str(kind)]:
        versions = ", ".join(MANIFEST_KINDS[str(kind)])
        return [
            ("apiVersion", f"unknown apiVersion {shown(version)} for {kind} (expected {versions})")
        ]
    return []


def _manifest_path(path: str, draft: Draft) -> str:
    """A spec field's path as the manifest field it came from, where one is known."""
    match = _ROLE_PATH.fullmatch(path)
    if match:
        roles = draft.data.get("roles") or []
        index = int(match.group(1))
        name = roles[index].get("name") if index < len(roles) else None
        origin = draft.origins.get(str(name))
        if origin is not None:
            return f"{origin} ({match.group(2) or 'role'})"
    return {"name": "metadata.name", "labels": "metadata.labels"}.get(path, path)


def translate_manifest(
    data: Mapping[str, Any],
    source: str | None = None,
    runtimes: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[JobSpec, list[tuple[str, str]]]:
    """The spec a TFJob, PyTorchJob or TrainJob manifest describes, and its warnings.

    ``runtimes``: training runtime manifests by name, for a TrainJob's ``runtimeRef``
    (:mod:`.runtime`). Raises :class:`SpecError` naming each field path at fault; stores
    nothing.
    """
    problems = _kind_problems(data)
    if problems:
        raise SpecError(problems, source)
    if data["kind"] == "TrainJob":
        draft = trainjob.read_trainjob(data, runtimes)
    else:
        draft = kubeflow.read_kubeflow_job(data)
    if draft.problems:
        raise SpecError(draft.problems, source)
    try:
        spec = parse_spec(draft.data)
    except SpecError as exc:
        raise SpecError([(_manifest_path(p, draft), m) for p, m in exc.problems], source) from None
    return spec, draft.warnings


def spec_from_document(
    data: Any, source: str | None = None
) -> tuple[JobSpec, list[tuple[str, str]]]:
    """A tidal spec from a parsed document, translated first if it is a manifest; with the
    translation's warnings (none for a tidal spec)."""
    if is_manifest(data):
        return translate_manifest(data, source)
    return parse_spec(data, source), []


def _read_document(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([("", f"cannot read: {exc}")], str(path)) from None
    try:
        return load_yaml(text, SPEC_LIMITS)
    except DocumentError as exc:
        raise SpecError(exc.problems, str(path)) from None


def load_file(
    path: str | Path, runtime_files: Sequence[str | Path] = ()
) -> tuple[JobSpec, list[tuple[str, str]]]:
    """A spec or manifest from a YAML (or JSON) file, with the translation's warnings;
    a missing, unreadable or refused file is a :class:`SpecError` naming the file.

    ``runtime_files``: Kubeflow Trainer runtime manifests a TrainJob may name.
    """
    p = Path(path)
    data = _read_document(p)
    if not runtime_files:
        return spec_from_document(data, str(p))
    if not (is_manifest(data) and data.get("kind") == "TrainJob"):
        raise SpecError([("runtime", "only a TrainJob names a training runtime")], str(p))
    try:
        runtimes = runtime.runtimes_by_name(
            (str(f), _read_document(Path(f))) for f in runtime_files
        )
    except ValueError as exc:
        raise SpecError([("runtime", str(exc))], str(p)) from None
    return translate_manifest(data, str(p), runtimes)
