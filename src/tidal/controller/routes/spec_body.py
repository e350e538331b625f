"""Reading a job spec from a request body (JSON, or YAML by content type) and answering
its problems with field paths."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from tidal.compat import spec_from_document
from tidal.controller.cluster import ClusterModel
from tidal.controller.routes.deps import UNPROCESSABLE
from tidal.controller.routes.limits import off_loop
from tidal.controller.support import (
    LOCAL,
    Capabilities,
    missing_files,
    too_big,
    too_wide,
    torchrun_hints,
    unsupported,
)
from tidal.documents import load_yaml
from tidal.documents_bounds import SPEC_LIMITS, DocumentError
from tidal.documents_json import load_json
from tidal.model import job_from_spec
from tidal.spec import JobSpec, SpecError

__all__ = [
    "SPEC_BODY",
    "check_runnable",
    "parse_spec_body",
    "read_spec",
    "spec_loc",
    "spec_problem_response",
    "spec_text",
]

#: JSON bodies up to this size are parsed on the event loop: the worst such document
#: (2,000 levels of nesting) takes about 2 ms, an ordinary spec 0.05 ms, and handing one
#: to a parsing thread cost more than parsing it (it queued submissions under load).
#: YAML and larger JSON go to the parsing thread (a 4 KiB YAML flow list takes ~17 ms).
INLINE_JSON_BYTES = 4096

_YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")

#: The OpenAPI description of a body that is a spec in JSON or YAML.
SPEC_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "application/yaml": {"schema": {"type": "string"}},
        },
    }
}


def spec_loc(path: str) -> list[str | int]:
    """A spec field's dotted path as a FastAPI error location in the body."""
    parts = [p for p in path.replace("[", ".").replace("]", "").split(".") if p]
    return ["body", *[int(p) if p.isascii() and p.isdigit() and len(p) < 10 else p for p in parts]]


def spec_problem_response(exc: SpecError) -> JSONResponse:
    """A 422 listing every problem of a refused spec."""
    detail = [
        {"loc": spec_loc(path), "path": path, "msg": message, "type": "spec_error"}
        for path, message in exc.problems
    ]
    return JSONResponse(status_code=UNPROCESSABLE, content={"detail": detail})


async def spec_text(request: Request) -> tuple[str, bool]:
    """A request's body as text, and whether it is YAML (by content type) rather than JSON."""
    body = await request.body()
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip()
    return body.decode("utf-8", errors="replace"), ctype in _YAML_TYPES


def read_spec(
    text: str,
    is_yaml: bool,
    capabilities: Capabilities = LOCAL,
    cluster: ClusterModel | None = None,
) -> tuple[JobSpec, list[tuple[str, str]]]:
    """The spec in a request body (a tidal spec, or a Kubeflow manifest translated, with
    its warnings), if a backend of ``capabilities`` can run it on ``cluster``; raises
    :class:`SpecError` (with what it cannot run: :func:`tidal.controller.support.
    unsupported`, :func:`~tidal.controller.support.too_wide`)."""
    try:
        data = load_yaml(text, SPEC_LIMITS) if is_yaml else load_json(text, SPEC_LIMITS)
    except DocumentError as exc:
        raise SpecError(exc.problems) from None
    spec, warnings = spec_from_document(data)
    check_runnable(spec, capabilities, cluster)
    if capabilities.shared_files:
        warnings += torchrun_hints(job_from_spec(spec), named_roles=spec.has_roles)
    return spec, warnings


async def parse_spec_body(
    request: Request,
    text: str,
    is_yaml: bool,
    capabilities: Capabilities,
    cluster: ClusterModel | None = None,
) -> tuple[JobSpec, list[tuple[str, str]]]:
    """:func:`read_spec` of a request's body: on the loop for a small JSON one, else in
    the parsing thread (:func:`~tidal.controller.routes.limits.off_loop`)."""
    if not is_yaml and len(text) <= INLINE_JSON_BYTES:
        return read_spec(text, is_yaml, capabilities, cluster)
    return await off_loop(request, read_spec, text, is_yaml, capabilities, cluster)


def check_runnable(
    spec: JobSpec, capabilities: Capabilities = LOCAL, cluster: ClusterModel | None = None
) -> None:
    """Raise :class:`SpecError` naming every part of ``spec`` a backend of
    ``capabilities`` cannot run, or ``cluster`` cannot hold, or (a backend whose workers
    see this host's files) a working dir or script that is not there."""
    job = job_from_spec(spec)
    problems = unsupported(job, named_roles=spec.has_roles, capabilities=capabilities)
    if capabilities.shared_files:
        problems += missing_files(job, named_roles=spec.has_roles)
    if cluster is not None:
        problems += too_wide(job, cluster, named_roles=spec.has_roles)
        problems += too_big(job, cluster, named_roles=spec.has_roles)
    if problems:
        raise SpecError(problems)
