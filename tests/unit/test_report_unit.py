"""The report page without a farm or a browser: every job-supplied string is escaped,
each plot is inline SVG, and memory holds only the listed jobs."""

from __future__ import annotations

import json
from pathlib import Path

from producer.report import load, render
from producer.report.data import TOP

EVIL = "<script>alert(1)</script><img src=x onerror=alert(2)>\"'&"


def _record(i: int, status: str, **extra: object) -> dict:
    return {
        "id": f"job-{i}",
        "status": status,
        "backend": "process",
        "timings": {"run_ms": 10.0 * i, "queue_wait_ms": 5.0, "phases": {"steps_ms": 9.0}},
        "labels": {"task": f"t{i % 2}"},
        **extra,
    }


def test_hostile_job_text_is_escaped_everywhere(tmp_path: Path):
    hostile = _record(
        99,
        "failed",
        message=EVIL,
        labels={"task": EVIL},
        steps=[{"status": "failed", "stderr": f"Traceback\n{EVIL}\n"}],
    )
    hostile["id"] = EVIL
    rows = [_record(i, "succeeded") for i in range(30)] + [hostile, {"line": 3, "error": "x"}]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = load(path)
    assert data.jobs == 31 and data.invalid == 1 and len(data.slowest) == TOP
    page = render(data)
    assert "<script" not in page and "<img" not in page  # no element of the job's
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "Content-Security-Policy" in page
    for plot in ("status_mix", "run_time", "queue_wait", "phases", "pass_at_k"):
        start = page.index(f'data-plot="{plot}"')
        assert page[start : start + 200].count("<svg") == 1, plot


def test_mathtext_in_job_labels_is_plain_text(tmp_path: Path):
    """matplotlib would parse "$...$" in a label as math and fail the whole report."""
    rows = [_record(i, "succeeded", labels={"task": "$\\frac$" if i else "$x^$"}) for i in range(4)]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = render(load(path))
    assert page.count("<svg") >= 4 and "$\\frac$" in page
