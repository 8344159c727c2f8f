"""Input lines of a batch: each non-blank line one JobSpec, or a LineError saying why not."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_core import JobSpec, SpecError, parse_spec

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class LineError:
    """One input line that could not become a job."""

    file: str
    line: int
    error: str

    def record(self) -> dict[str, Any]:
        return {"line": self.line, "file": self.file, "error": self.error}


def _safe(text: str, limit: int) -> str:
    cleaned = _UNSAFE.sub("-", text).strip("-.")[:limit]
    return cleaned if cleaned[:1].isalnum() else f"j{cleaned}"[:limit]


def derive_id(file_name: str, line_no: int, text: str, prefix: str | None = None) -> str:
    """A stable job id for a line without one: name, line number and content hash.

    The same line of the same file always gets the same id (so resume and the farm's
    idempotency recognise it); an edited line gets a new one. Only the file's base name
    counts, so moving the input or running from another directory still resumes.
    """
    digest = hashlib.sha256(text.strip().encode("utf-8", "surrogatepass")).hexdigest()[:16]
    stem = _safe(Path(file_name).name.removesuffix(".jsonl"), 64) or "batch"
    job_id = f"{stem}:{line_no}:{digest}"
    if prefix:
        job_id = f"{_safe(prefix, 32)}:{job_id}"
    return job_id


def parse_line(
    file_name: str, line_no: int, text: str, prefix: str | None = None
) -> JobSpec | LineError:
    """One JSONL line to a JobSpec with an id, or the LineError saying why not."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        reason = getattr(exc, "msg", str(exc))
        column = getattr(exc, "colno", None)
        where = f" (column {column})" if column else ""
        return LineError(file_name, line_no, f"json: not valid JSON: {reason}{where}")
    if not isinstance(data, dict):
        return LineError(
            file_name, line_no, f"job: a job is a JSON object, got {type(data).__name__}"
        )
    try:
        spec = parse_spec(data)
    except SpecError as exc:
        return LineError(file_name, line_no, str(exc))
    if spec.id is None:  # an explicit id is the client's idempotency key: kept as given
        spec.id = derive_id(file_name, line_no, text, prefix)
    return spec


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) for every non-blank line."""
    with path.open(encoding="utf-8", errors="surrogateescape") as fh:
        for number, raw in enumerate(fh, start=1):
            text = raw.strip()
            if text:
                yield number, text


def job_ids_of(path: Path, prefix: str | None = None) -> list[str]:
    """The ids `batch run` gives the valid lines of ``path`` (to cancel a batch)."""
    ids = []
    for line_no, text in iter_lines(path):
        item = parse_line(path.name, line_no, text, prefix)
        if isinstance(item, JobSpec) and item.id is not None:
            ids.append(item.id)
    return ids
