"""Raw data to a JobSpec, and pydantic's errors to one SpecError a person can act on:
the field (as the user wrote it), the reason in plain words, the nearest known name for
a typo."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from sandbox_core.errors import SpecError
from sandbox_core.models import BashStep, JobSpec, Limits, PythonStep, ReadFileStep, WriteFileStep

STEP_MODELS: dict[str, type[BaseModel]] = {
    "bash": BashStep,
    "python": PythonStep,
    "write_file": WriteFileStep,
    "read_file": ReadFileStep,
}
# Errors worth showing first: a typo explains the "field required" it causes.
_FIRST = ("extra_forbidden", "union_tag_invalid", "union_tag_not_found")


def parse_spec(data: object) -> JobSpec:
    """Validate raw data (a dict, or JSON text) into a JobSpec; SpecError names the field."""
    try:
        if isinstance(data, str | bytes):
            return JobSpec.model_validate_json(data)
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise first_error(exc) from None


def first_error(exc: ValidationError) -> SpecError:
    """The most telling error of a ValidationError, with its field and reason."""
    return explain(exc.errors(include_url=False))


def explain(errors: Sequence[Any], root: type[BaseModel] = JobSpec) -> SpecError:
    """The most telling of pydantic's error records (``type``, ``loc``, ``msg``, ``input``,
    ``ctx``), with its field and reason; loc as the user wrote the data, in a ``root``."""
    errors = sorted(
        errors, key=lambda e: 0 if e["type"] in _FIRST else 2 if e["type"] == "missing" else 1
    )
    err = errors[0]
    ctx_error = (err.get("ctx") or {}).get("error")
    loc = _field_path(err["loc"])
    if isinstance(ctx_error, SpecError):
        field = f"{loc}.{ctx_error.field}" if loc else ctx_error.field
        return SpecError(field, ctx_error.reason)
    reason = _reason(err, root)
    more = len(errors) - 1
    if more and err["type"] not in _FIRST:
        reason += f" (and {more} more)"
    return SpecError(loc or ("job" if root is JobSpec else "body"), reason, err.get("input"))


def _field_path(loc: tuple[int | str, ...]) -> str:
    """steps.0.bash.command -> steps.0.command; files./x.[key] -> files./x."""
    parts: list[str] = []
    for index, part in enumerate(loc):
        if part == "[key]":
            continue
        if part in STEP_MODELS and index >= 2 and loc[index - 2] == "steps":
            continue  # the discriminator's tag, not a field the user wrote
        parts.append(str(part))
    return ".".join(parts)


def _reason(err: Any, root: type[BaseModel]) -> str:
    kind, loc = err["type"], err["loc"]
    if kind == "extra_forbidden":
        name = str(loc[-1])
        parent = _model_at(root, loc[:-1])
        known = [] if parent is None else [f for f in parent.model_fields if f != "kind"]
        near = difflib.get_close_matches(name, known, n=1)
        if not near and parent is JobSpec:  # a limit given at a job's top: "timeout"
            limits = {f: f"limits.{f}" for f in Limits.model_fields}
            near = [limits[m] for m in difflib.get_close_matches(name, list(limits), n=1)]
        hint = f"; did you mean {near[0]!r}?" if near else f"; known: {', '.join(known)}"
        hint = hint if near or known else ""
        return f"unknown field{hint}"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        tag = (err.get("ctx") or {}).get("tag", "")
        near = difflib.get_close_matches(str(tag), list(STEP_MODELS), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        return f"kind {tag!r} is not a step kind; choose one of {', '.join(STEP_MODELS)}{hint}"
    message = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    value = repr(err.get("input"))
    if len(value) > 60:
        value = value[:57] + "..."
    return f"{message} (got {value})" if kind != "missing" else message.lower()


def _model_at(root: type[BaseModel], path: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model ``path`` (a pydantic loc, its list indexes and step kinds included)
    names inside ``root``."""
    model, rest = root, list(path)
    while rest:
        field = model.model_fields.get(str(rest.pop(0)))
        if field is None:
            return None
        if rest and isinstance(rest[0], int):
            rest.pop(0)  # an item of a list
        inner = _models_in(field.annotation)
        if rest and str(rest[0]) in STEP_MODELS and STEP_MODELS[str(rest[0])] in inner:
            inner = [STEP_MODELS[str(rest.pop(0))]]  # the tag of a union of steps
        if len(inner) != 1:
            return None
        model = inner[0]
    return model


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds: X, X | None, list[X], Annotated[A | B, ...]."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]
