"""Input lines of a batch: each non-blank line one JobSpec, or a LineError saying why not."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_core import JobSpec, SpecError, parse_spec

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_ID_LEN = 128  # sandbox_core's id rule: 1-128 of [A-Za-z0-9._:@-]
MAX_PREFIX_LEN = 32  # leaves a derived id (stem 64 + line + hash) room under MAX_ID_LEN
STDIN_NAME = "stdin"  # the name of input `-` in derived ids and error records


@dataclass(frozen=True)
class LineError:
    """One input line that could not become a job."""

    file: str
    line: int
    error: str

    def record(self) -> dict[str, Any]:
        return {"line": self.line, "file": self.file, "error": self.error}


@dataclass(frozen=True)
class Defaults:
    """Batch-wide values for lines that set none (`--backend`, `--timeout`, `--memory-mb`).

    A line's own value always wins. A default that applies becomes part of the line's
    spec, so of the farm's spec hash, and of the line's derived id: a rerun with another
    default is another job, never the stored verdict of the old one (nor a conflict).
    """

    backend: str | None = None
    timeout_s: float | None = None
    memory_mb: int | None = None

    def apply(self, data: dict[str, Any]) -> dict[str, Any]:
        """Fill in what ``data`` leaves unset; return what was filled in (dotted names)."""
        applied: dict[str, Any] = {}
        if self.backend is not None and data.get("backend") is None:
            data["backend"] = applied["backend"] = self.backend
        limits = data.get("limits")
        if limits is None:
            limits = {}
        if not isinstance(limits, dict):
            return applied  # not an object: parse_spec names the field
        for name, value in (("timeout_s", self.timeout_s), ("memory_mb", self.memory_mb)):
            if value is not None and limits.get(name) is None:
                limits = {**limits, name: value}
                applied[f"limits.{name}"] = value
        if limits:
            data["limits"] = limits
        return applied


def safe_prefix(prefix: str) -> str:
    """The id prefix as used: the characters ids allow, at most MAX_PREFIX_LEN."""
    return _safe(prefix, MAX_PREFIX_LEN)


def _safe(text: str, limit: int) -> str:
    cleaned = _UNSAFE.sub("-", text).strip("-.")[:limit]
    return cleaned if cleaned[:1].isalnum() else f"j{cleaned}"[:limit]


def derive_id(
    file_name: str,
    line_no: int,
    text: str,
    prefix: str | None = None,
    applied: Mapping[str, Any] | None = None,
) -> str:
    """A stable job id for a line without one: name, line number and content hash.

    The same line of the same file always gets the same id (so resume and the farm's
    idempotency recognise it); an edited line gets a new one, and so does a line that a
    different batch default (``applied``) turns into a different spec. Only the file's
    base name counts, so moving the input or running from another directory still resumes.
    """
    content = text.strip()
    if applied:  # only then: ids of lines that take no default stay as they always were
        content += "\n" + json.dumps(dict(applied), sort_keys=True)
    digest = hashlib.sha256(content.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    stem = _safe(Path(file_name).name.removesuffix(".jsonl"), 64) or "batch"
    job_id = f"{stem}:{line_no}:{digest}"
    if prefix:
        job_id = f"{safe_prefix(prefix)}:{job_id}"
    return job_id


@dataclass(frozen=True)
class Parsed:
    """A line parsed: its spec (with its final id) or why not; ``explicit``: the id was
    the line's own (so not content-addressed: the same id may name an edited spec)."""

    item: JobSpec | LineError
    explicit: bool = False


def parse(
    file_name: str,
    line_no: int,
    text: str,
    prefix: str | None = None,
    defaults: Defaults | None = None,
) -> Parsed:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        reason = getattr(exc, "msg", str(exc))
        column = getattr(exc, "colno", None)
        where = f" (column {column})" if column else ""
        return Parsed(LineError(file_name, line_no, f"json: not valid JSON: {reason}{where}"))
    if not isinstance(data, dict):
        error = f"job: a job is a JSON object, got {type(data).__name__}"
        return Parsed(LineError(file_name, line_no, error))
    applied = defaults.apply(data) if defaults else {}
    try:
        spec = parse_spec(data)
    except SpecError as exc:
        return Parsed(LineError(file_name, line_no, str(exc)))
    if spec.id is None:
        spec.id = derive_id(file_name, line_no, text, prefix, applied)
        return Parsed(spec)
    if prefix:  # the prefix namespaces every id of the batch, the line's own too
        prefixed = f"{safe_prefix(prefix)}:{spec.id}"
        if len(prefixed) > MAX_ID_LEN:
            error = (
                f"id: {spec.id!r} is too long with --id-prefix {safe_prefix(prefix)!r}:"
                f" {len(prefixed)} characters, at most {MAX_ID_LEN}"
            )
            return Parsed(LineError(file_name, line_no, error), explicit=True)
        spec.id = prefixed
    return Parsed(spec, explicit=True)


def parse_line(
    file_name: str,
    line_no: int,
    text: str,
    prefix: str | None = None,
    defaults: Defaults | None = None,
) -> JobSpec | LineError:
    """One JSONL line to a JobSpec with its final id, or the LineError saying why not."""
    return parse(file_name, line_no, text, prefix, defaults).item


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) for every non-blank line."""
    with path.open(encoding="utf-8", errors="surrogateescape") as fh:
        for number, raw in enumerate(fh, start=1):
            text = raw.strip()
            if text:
                yield number, text


def job_ids_of(
    path: Path,
    prefix: str | None = None,
    defaults: Defaults | None = None,
    name: str | None = None,
) -> list[str]:
    """The ids `batch run` gives the valid lines of ``path`` (to cancel a batch): the
    same ``--id-prefix`` and batch defaults give the same ids."""
    ids = []
    for line_no, text in iter_lines(path):
        item = parse_line(name or path.name, line_no, text, prefix, defaults)
        if isinstance(item, JobSpec) and item.id is not None:
            ids.append(item.id)
    return ids
