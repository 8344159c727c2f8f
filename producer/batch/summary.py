"""The closing summary of a batch: counts by status, run time and queue wait, and the
jobs whose ``expect`` label disagrees with their status."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from producer.batch.groups import Groups
from producer.terminal import plain

EXPECT_LABEL = "expect"  # a label naming the status a job is expected to end with
STATUS_STYLES = {
    "succeeded": "green",
    "failed": "red",
    "timed_out": "yellow",
    "memory_exceeded": "magenta",
    "output_flooded": "magenta",
    "crashed": "bold red",
    "wrong_answer": "red",
    "rejected": "yellow",
    "error": "bold red",
    "cancelled": "dim",
    "invalid": "bold yellow",
}


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile (pct in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f} ms" if value < 1000 else f"{value / 1000:.2f} s"


@dataclass
class Summary:
    """What a batch produced: counts by status, run time and queue wait, expectations."""

    statuses: Counter[str] = field(default_factory=Counter)
    run_ms: list[float] = field(default_factory=list)
    queue_wait_ms: list[float] = field(default_factory=list)
    invalid: int = 0
    expected: int = 0
    mismatches: list[tuple[str, str, str]] = field(default_factory=list)  # id, expected, got
    groups: Groups | None = None  # --group-by: pass counts and pass@k per label value

    def add(self, record: dict[str, Any]) -> None:
        """Count one result, given as its JSON dict (as stored in RESULTS)."""
        status = str(record.get("status"))
        self.statuses[status] += 1
        timings = record.get("timings") or {}
        if isinstance(timings.get("run_ms"), int | float):
            self.run_ms.append(float(timings["run_ms"]))
        if isinstance(timings.get("queue_wait_ms"), int | float):
            self.queue_wait_ms.append(float(timings["queue_wait_ms"]))
        if self.groups is not None:
            self.groups.add(record)
        expect = (record.get("labels") or {}).get(EXPECT_LABEL)
        if expect:
            self.expected += 1
            if expect != status:
                self.mismatches.append((str(record.get("id")), expect, status))

    def as_json(self) -> dict[str, Any]:
        """The summary as data (``--summary-json``)."""

        def spread(values: list[float]) -> dict[str, float | None]:
            top = max(values) if values else None
            return {"p50": percentile(values, 50), "p95": percentile(values, 95), "max": top}

        out: dict[str, Any] = {
            "jobs": self.jobs,
            "invalid": self.invalid,
            "statuses": dict(self.statuses.most_common()),
            "run_ms": spread(self.run_ms),
            "queue_wait_ms": spread(self.queue_wait_ms),
            "expected": {"labelled": self.expected, "mismatches": len(self.mismatches)},
        }
        if self.groups is not None:
            out["groups"] = self.groups.as_json()
        return out

    @property
    def jobs(self) -> int:
        return sum(self.statuses.values())

    def render(
        self,
        elapsed_s: float | None = None,
        resumed: int = 0,
        missing: int = 0,
        earlier: int = 0,
        missing_hint: str = "rerun to resume",
    ) -> Group:
        """``resumed``: results read back from RESULTS; ``earlier``: results the farm
        handed back this run for jobs done before it began. Neither counts as new, so
        jobs/s is this invocation's own rate."""
        counts = Table(title="sandfarm batch", title_justify="left", show_edge=False)
        counts.add_column("status")
        counts.add_column("jobs", justify="right")
        counts.add_column("share", justify="right")
        total = self.jobs + self.invalid
        rows = [*self.statuses.most_common()]
        if self.invalid:
            rows.append(("invalid", self.invalid))
        for status, count in rows:
            share = f"{100 * count / total:.0f}%" if total else "-"
            counts.add_row(Text(status, style=STATUS_STYLES.get(status, "")), str(count), share)
        counts.add_section()
        counts.add_row("total", str(total), "")

        timing = Table(show_edge=False)
        timing.add_column("")
        for name in ("p50", "p95", "max"):
            timing.add_column(name, justify="right")
        for name, values in (("run time", self.run_ms), ("queue wait", self.queue_wait_ms)):
            top = max(values) if values else None
            timing.add_row(name, _ms(percentile(values, 50)), _ms(percentile(values, 95)), _ms(top))

        parts: list[Any] = [counts, Text(""), timing, Text("")]
        if self.groups is not None and self.groups.counts:
            parts += [self.groups.table(), Text("")]
        fresh = self.jobs - resumed - earlier
        line = f"{self.jobs} results"
        if elapsed_s and fresh:
            line += f": {fresh} new in {elapsed_s:.1f} s ({fresh / elapsed_s:.1f} jobs/s)"
        if earlier:
            line += f"; {earlier} already done before this run (stored results handed back)"
        if resumed:
            line += f"; {resumed} from an earlier run (resumed)"
        parts.append(Text(line))
        if self.invalid:
            parts.append(Text(f"{self.invalid} invalid input lines (see RESULTS and stderr)"))
        if missing:
            hint = f": {missing_hint}" if missing_hint else ""
            parts.append(Text(f"{missing} still without a result{hint}", "bold red"))
        if self.expected:
            matched = self.expected - len(self.mismatches)
            style = "green" if not self.mismatches else "yellow"
            parts.append(
                Text(f"expected status: {matched}/{self.expected} as labelled", style=style)
            )
            for job_id, want, got in self.mismatches[:10]:
                shown = plain(f"  {job_id}: expected {want}, got {got}")  # a label's words
                shown.stylize("yellow")
                shown.no_wrap, shown.overflow = True, "ellipsis"  # no row of its own
                parts.append(shown)
            if len(self.mismatches) > 10:
                parts.append(Text(f"  ... and {len(self.mismatches) - 10} more"))
        return Group(*parts)
