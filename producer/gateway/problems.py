"""Errors as RFC 9457 problem details (``application/problem+json``): a type, a title, the
HTTP status, what went wrong in plain words, and — where a field is to blame — its name."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from sandbox_core.errors import SpecError
from sandbox_core.models import JobSpec
from sandbox_core.validation import explain

PROBLEM = "application/problem+json"
TYPES = "https://sandfarm.invalid/problems/"  # stable identifiers, not pages


class Problem(BaseModel):
    """RFC 9457 problem details, with the field a client must fix (if any)."""

    type: str = Field(description="a URI naming the kind of problem")
    title: str
    status: int
    detail: str
    field: str | None = Field(None, description="the request field at fault")
    ids: list[str] | None = Field(None, description="the job ids concerned")
    fewer: bool | None = Field(
        None, description="429: this call can never pass (or not today), a smaller one can"
    )


class ProblemError(Exception):
    """Raised in a route: becomes its problem response."""

    def __init__(
        self,
        status: int,
        kind: str,
        title: str,
        detail: str,
        *,
        field: str | None = None,
        ids: list[str] | None = None,
        headers: dict[str, str] | None = None,
        fewer: bool | None = None,
    ) -> None:
        super().__init__(detail)
        self.problem = Problem(
            type=TYPES + kind,
            title=title,
            status=status,
            detail=detail,
            field=field,
            ids=ids,
            fewer=fewer,
        )
        self.headers = headers or {}


def response(problem: Problem, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        problem.model_dump(exclude_none=True),
        status_code=problem.status,
        media_type=PROBLEM,
        headers=headers,
    )


async def on_problem(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ProblemError)
    return response(exc.problem, exc.headers)


def _json_media(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _body_model(request: Request) -> type[BaseModel]:
    """The model the route reads its body as (a job, a list of jobs, a list of ids): the
    names an unknown field is matched against."""
    body = getattr(request.scope.get("route"), "body_field", None)
    model = getattr(getattr(body, "field_info", None), "annotation", None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else JobSpec


async def on_invalid(request: Request, exc: Exception) -> JSONResponse:
    """A body that does not validate: 422 naming the most telling offending field; 415 for
    a body of another content type (FastAPI reads only JSON types as JSON, so a job sent
    as a form, as `curl -d` sends it, would be 422 "job: Input should be a valid
    dictionary"); 400 for one sent as JSON that is not JSON."""
    assert isinstance(exc, RequestValidationError)
    sent_as = request.headers.get("content-type")
    if (
        sent_as
        and not _json_media(sent_as)
        and any(e["loc"][:1] == ("body",) for e in exc.errors())
    ):
        media = sent_as.split(";", 1)[0].strip()[:100]
        detail = f"the body is sent as {media!r}: send it as JSON (Content-Type: application/json)"
        return response(
            Problem(
                type=TYPES + "unsupported-media-type",
                title="Unsupported Media Type",
                status=415,
                detail=detail,
            )
        )
    for error in exc.errors():
        if error.get("type") == "json_invalid":  # not JSON at all: 400, as documented
            reason = (error.get("ctx") or {}).get("error") or error.get("msg")
            where = error["loc"][-1] if isinstance(error["loc"][-1], int) else None
            at = f" at character {where}" if where is not None else ""
            detail = f"the body is not JSON: {reason}{at}"
            return response(
                Problem(type=TYPES + "malformed", title="Bad Request", status=400, detail=detail)
            )
    errors = [{**e, "loc": tuple(e["loc"][1:])} for e in exc.errors()]  # drop "body"
    root = _body_model(request)
    spec_error = explain(errors, root) if errors else SpecError("request", "the request is invalid")
    return response(
        Problem(
            type=TYPES + "invalid",
            title="Invalid request",
            status=422,
            detail=str(spec_error),
            field=spec_error.field,
        )
    )


# What any /v1 route may answer: unparsable JSON, no valid key, a body over the limit,
# an invalid parameter or header, Redis away.
EVERY_ROUTE = (400, 401, 413, 422, 503)


def problems(*statuses: int, api: bool = True) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` entry for routes that answer these problems (with
    ``api``, also those every /v1 route may answer)."""
    every = EVERY_ROUTE if api else ()
    return {
        status: {"model": Problem, "content": {PROBLEM: {"schema": Problem.model_json_schema()}}}
        for status in sorted({*every, *statuses})
    }


async def on_http_error(_: Request, exc: Exception) -> JSONResponse:
    """Starlette's own errors (a body that is not JSON, an unknown route or method) as
    problems too."""
    assert isinstance(exc, StarletteHTTPException)
    kinds = {400: "malformed", 404: "not-found", 405: "method", 413: "too-large"}
    problem = Problem(
        type=TYPES + kinds.get(exc.status_code, "http"),
        title=HTTPStatus(exc.status_code).phrase,
        status=exc.status_code,
        detail=str(exc.detail),
    )
    return response(problem, dict(exc.headers or {}))
