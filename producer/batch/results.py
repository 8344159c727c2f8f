"""The RESULTS file: one JSON document per line, appended and flushed one by one, read
back to resume (ids already answered are skipped)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from producer.batch.summary import EXPECT_LABEL


@dataclass
class Previous:
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> light record
    errors: set[tuple[str, int]] = field(default_factory=set)  # (file, line) already written
    needs_newline: bool = False


def read_results(path: Path) -> Iterator[dict[str, Any]]:
    """Every parseable JSON object in RESULTS; a torn last line (a crash) is ignored."""
    if not path.exists():
        return
    with path.open(encoding="utf-8", errors="replace") as fh:
        for raw in fh:
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record


def load_previous(path: Path, labels: tuple[str, ...] = (EXPECT_LABEL,)) -> Previous:
    """What RESULTS holds; of each result's labels only ``labels`` are kept (memory)."""
    prev = Previous()
    for record in read_results(path):
        if isinstance(record.get("id"), str) and "status" in record:
            timings = record.get("timings") or {}
            prev.results[record["id"]] = {
                "id": record["id"],
                "status": record["status"],
                "timings": {k: timings.get(k) for k in ("run_ms", "queue_wait_ms")},
                "labels": {name: (record.get("labels") or {}).get(name) for name in labels},
            }
        elif "error" in record and isinstance(record.get("line"), int):
            prev.errors.add((str(record.get("file", "")), record["line"]))
    if path.exists() and path.stat().st_size:
        with path.open("rb") as fh:
            fh.seek(-1, 2)
            prev.needs_newline = fh.read(1) != b"\n"
    return prev


class ResultsWriter:
    """Appends one JSON document per line to RESULTS, flushed at once."""

    def __init__(self, fh: IO[str]) -> None:
        self.fh = fh

    def write(self, text: str) -> None:
        self.fh.write(text + "\n")
        self.fh.flush()
