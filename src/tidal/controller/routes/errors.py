"""What the API's routes answer when they refuse a request, said once for every route.

Every refusal has the same body, :class:`ErrorBody` (``detail``: a message, or a list of
problems each naming its field). :class:`DocumentedRoute`, the route class of every
router, puts in a route's OpenAPI operation the statuses it can answer from what the route
is: a path naming a job (404, 409), a body (400, 413, 422), parameters (422); a
:class:`ProtectedRoute` (the routers behind the bearer token) adds the token's (401,
403). It also answers a method its path does not serve with every method the path
serves (``Allow``; ``OPTIONS`` too), not only those of the first route found.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import params
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict
from starlette.types import Receive, Scope, Send

__all__ = [
    "ACCOUNT_ERRORS",
    "AUTH_ERRORS",
    "DocumentedRoute",
    "ErrorBody",
    "Problem",
    "ProtectedRoute",
    "allowed_methods",
]


class Problem(BaseModel):
    """One thing wrong with a request, at ``loc`` (``["body", "workers"]``)."""

    model_config = ConfigDict(extra="allow")

    loc: list[str | int]
    msg: str
    type: str
    #: The field's dotted path in the job spec (``roles.worker.replicas``), where known.
    path: str | None = None


class ErrorBody(BaseModel):
    """The body of every refusal: a message, or the problems of the request."""

    # A job whose stored row cannot be read is also named (``job``, ``state``).
    model_config = ConfigDict(extra="allow")

    detail: str | list[Problem]


Responses = dict[int | str, dict[str, Any]]


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


def _as_json(doc: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` for a route whose own answer is not JSON (logs, metrics): its refusals
    still are (FastAPI would give them the route's media type)."""
    if "model" not in doc:
        return dict(doc)
    ref = {"$ref": f"#/components/schemas/{doc['model'].__name__}"}
    rest = {k: v for k, v in doc.items() if k != "model"}
    return {**rest, "content": {"application/json": {"schema": ref}}}


#: Answered by every route behind the bearer token.
AUTH_ERRORS: Responses = {
    401: _error("No bearer token or session, or one unknown, revoked or expired."),
    403: _error(
        "The user's role or team does not allow it (the detail says why), or a change "
        "authenticated by the dashboard's cookie without the anti-forgery header."
    ),
}
#: Answered by the routes on users and tokens.
ACCOUNT_ERRORS: Responses = {
    404: _error("No user (or token) of that name."),
    409: _error("The name is taken, or the change would leave no admin."),
}
_JOB_ERRORS: Responses = {
    404: _error("No job (or worker) of that name."),
    409: _error("The job's state does not allow it, or its stored row cannot be read."),
}
_BODY_ERRORS: Responses = {
    400: _error("The body could not be read."),
    413: _error("The body is larger than the server allows."),
}
_INVALID = _error("A parameter or the body is invalid: each problem names its field.")


def _has_body(endpoint: Callable[..., Any], extra: Mapping[str, Any] | None) -> bool:
    """Whether the route reads a body: a model parameter, or one it reads itself and
    describes in ``openapi_extra``."""
    if extra and "requestBody" in extra:
        return True
    hints = typing.get_type_hints(endpoint, include_extras=True)
    for name in inspect.signature(endpoint).parameters:
        hint = hints.get(name)
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            return True
        annotated = typing.get_origin(hint) is typing.Annotated
        if annotated and any(isinstance(m, params.Body) for m in typing.get_args(hint)[1:]):
            return True
    return False


def _has_parameters(path: str, endpoint: Callable[..., Any]) -> bool:
    """Whether the route takes path or query parameters (which may be invalid)."""
    if "{" in path:
        return True
    hints = typing.get_type_hints(endpoint, include_extras=True)
    for name, parameter in inspect.signature(endpoint).parameters.items():
        hint = hints.get(name)
        if typing.get_origin(hint) is typing.Annotated:
            if any(isinstance(m, params.Depends) for m in typing.get_args(hint)[1:]):
                continue  # a dependency, not a parameter
            return True
        if hint in (int, str, float, bool) or parameter.default is not inspect.Parameter.empty:
            return True
    return False


def route_errors(
    path: str, endpoint: Callable[..., Any], extra: Mapping[str, Any] | None
) -> Responses:
    """The refusals a route of ``path`` served by ``endpoint`` can answer."""
    found: Responses = {}
    if "{ref}" in path:
        found.update(_JOB_ERRORS)
    body = _has_body(endpoint, extra)
    if body:
        found.update(_BODY_ERRORS)
    if body or _has_parameters(path, endpoint):
        found[422] = _INVALID
    return found


def allowed_methods(schema: Mapping[str, Any], path: str) -> set[str]:
    """Every method the OpenAPI ``schema`` lists for ``path`` (its template)."""
    operations = schema.get("paths", {}).get(path, {})
    return {method.upper() for method in operations if method != "parameters"}


class DocumentedRoute(APIRoute):
    """A route whose operation lists the refusals it can answer (see the module
    docstring), and which answers an unserved method for its whole path."""

    #: Whether the route is behind the bearer token (:class:`ProtectedRoute`).
    protected = False

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        responses: Responses = dict(kwargs.pop("responses", None) or {})
        if self.protected:
            for code, doc in AUTH_ERRORS.items():
                responses.setdefault(code, doc)
        for code, doc in route_errors(path, endpoint, kwargs.get("openapi_extra")).items():
            responses.setdefault(code, doc)
        answer = kwargs.get("response_class")
        if isinstance(answer, type) and not issubclass(answer, JSONResponse):
            responses = {
                code: _as_json(doc) if str(code).startswith(("4", "5")) else doc
                for code, doc in responses.items()
            }
        super().__init__(path, endpoint, responses=responses, **kwargs)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request; a method this path does not serve is answered with every
        method it does (Starlette names those of the first route that matched only)."""
        if self.methods and scope["method"] not in self.methods:
            app = scope.get("app")
            # The schema's operations, what a client reads: routes are nested per router.
            methods = allowed_methods(app.openapi(), self.path_format) if app else set()
            allow = ", ".join(sorted((methods or self.methods or set()) | {"OPTIONS"}))
            response: Response
            if scope["method"] == "OPTIONS":
                response = Response(status_code=204, headers={"Allow": allow})
            else:
                response = JSONResponse(
                    {"detail": "Method Not Allowed"}, status_code=405, headers={"Allow": allow}
                )
            await response(scope, receive, send)
            return
        await super().handle(scope, receive, send)


class ProtectedRoute(DocumentedRoute):
    """A :class:`DocumentedRoute` behind the bearer token: it answers 401 and 403 too
    (the routers of :data:`tidal.controller.routes.PROTECTED_ROUTERS`)."""

    protected = True
