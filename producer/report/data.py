"""What the report shows, read from RESULTS in one pass with bounded memory: counts and
times per backend, groups, and only the slowest and first failing jobs in full."""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from producer.batch import read_results
from producer.batch.groups import Groups

TOP = 15  # slowest jobs and failing jobs listed
ERROR_LINES = 3  # first lines of the deciding step's error output
MAX_LINE = 200  # characters of one shown line
MAX_TIMES = 1_000_000  # run/queue times kept per backend (plots): memory stays bounded


@dataclass
class JobRow:
    id: str
    status: str
    backend: str
    run_ms: float
    detail: str  # message and first error lines, as the job left them (escaped later)


@dataclass
class ReportData:
    source: str
    statuses: Counter[str] = field(default_factory=Counter)
    run_ms: dict[str, list[float]] = field(default_factory=dict)  # by backend
    queue_wait_ms: dict[str, list[float]] = field(default_factory=dict)
    phases: dict[str, list[float]] = field(default_factory=dict)  # phase -> values
    groups: Groups | None = None
    slowest: list[tuple[float, int, JobRow]] = field(default_factory=list)  # a heap
    failing: list[JobRow] = field(default_factory=list)
    failing_total: int = 0
    invalid: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)  # eval runs: passed / failed / ...

    @property
    def jobs(self) -> int:
        return sum(self.statuses.values())


def _detail(record: dict[str, Any]) -> str:
    lines = [str(record.get("message") or "")]
    for step in record.get("steps") or []:
        if step.get("status") not in (None, "succeeded", "skipped"):
            text = str(step.get("stderr") or "")  # its message is in the job's already
            lines += [line for line in text.splitlines() if line.strip()][:ERROR_LINES]
            break
    return "\n".join(line[:MAX_LINE] for line in lines if line)


def _row(record: dict[str, Any], backend: str, run_ms: float) -> JobRow:
    status = str(record.get("status"))
    return JobRow(str(record.get("id"))[:MAX_LINE], status, backend, run_ms, _detail(record))


Verdict = Callable[[dict[str, Any]], str]  # an eval run's verdict of one JobResult


def load(
    path: Path, group_label: str | None = "task", verdict: Verdict | None = None
) -> ReportData:
    """``verdict``: for an eval run, what passing means (its harness's verdict, not the
    job's exit): groups count it, and the failing jobs are those not ``passed``."""
    data = ReportData(path.name, groups=Groups(group_label) if group_label else None)
    for index, record in enumerate(read_results(path)):
        if "status" not in record:
            data.invalid += 1  # an input line the batch could not run
            continue
        status = str(record["status"])
        backend = str(record.get("backend") or "-")
        data.statuses[status] += 1
        timings = record.get("timings") or {}
        run_ms = float(timings.get("run_ms") or 0.0)
        for name, into in (("run_ms", data.run_ms), ("queue_wait_ms", data.queue_wait_ms)):
            value = timings.get(name)
            values = into.setdefault(backend, [])
            if isinstance(value, int | float) and len(values) < MAX_TIMES:
                values.append(float(value))
        for phase, value in (timings.get("phases") or {}).items():
            values = data.phases.setdefault(phase.removesuffix("_ms"), [])
            if isinstance(value, int | float) and len(values) < MAX_TIMES:
                values.append(float(value))
        row = _row(record, backend, run_ms)
        passed = None
        if verdict is not None:
            said = verdict(record)
            passed = said == "passed"
            data.verdicts[said.split(":", 1)[0]] += 1
            row.detail = "\n".join(part for part in (said[:MAX_LINE], row.detail) if part)
        if data.groups is not None:
            data.groups.add(record, passed)
        entry = (run_ms, -index, row)
        if len(data.slowest) < TOP:
            heapq.heappush(data.slowest, entry)
        elif entry[:2] > data.slowest[0][:2]:
            heapq.heapreplace(data.slowest, entry)
        if (status != "succeeded") if passed is None else not passed:
            data.failing_total += 1
            if len(data.failing) < TOP:
                data.failing.append(entry[2])
    return data
