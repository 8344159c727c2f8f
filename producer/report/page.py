"""The report page: one HTML file, plots inline, every job-supplied string escaped, and a
Content-Security-Policy that runs no script at all (a second wall should escaping fail)."""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape

from producer.report import plots
from producer.report.data import JobRow, ReportData

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px auto; max-width: 1100px; color: #222 }
h1 { font-size: 22px } h2 { font-size: 17px; margin-top: 28px }
.plots { display: flex; flex-wrap: wrap; gap: 12px } .plot svg { max-width: 540px; height: auto }
table { border-collapse: collapse; margin: 8px 0 } td, th { padding: 3px 8px;
border-bottom: 1px solid #ddd; text-align: left; vertical-align: top }
td.num { text-align: right } pre { margin: 0; white-space: pre-wrap; font-size: 12px }
"""


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _plot(svg: str | None, name: str) -> str:
    return f'<div class="plot" data-plot="{_e(name)}">{svg}</div>' if svg else ""


def _jobs(rows: list[JobRow]) -> str:
    if not rows:
        return "<p>none</p>"
    body = "".join(
        f"<tr><td>{_e(r.id)}</td><td>{_e(r.status)}</td><td>{_e(r.backend)}</td>"
        f'<td class="num">{r.run_ms / 1000:.2f} s</td><td><pre>{_e(r.detail)}</pre></td></tr>'
        for r in rows
    )
    head = (
        "<tr><th>job</th><th>status</th><th>backend</th><th>run</th><th>first error lines</th></tr>"
    )
    return f"<table>{head}{body}</table>"


def _groups(data: ReportData) -> str:
    if data.groups is None or not data.groups.counts:
        return "<p>no job carries the label; give --group-by labels.NAME</p>"
    summary = data.groups.as_json()
    ks = list(summary["pass_at_k"])
    overall = ", ".join(f"{_e(k)} = {v:.4f}" for k, v in summary["pass_at_k"].items())
    head = "".join(f"<th>{_e(h)}</th>" for h in ("group", "jobs", "passed", *ks))
    rows = "".join(
        f"<tr><td>{_e(r['group'])}</td><td class='num'>{r['jobs']}</td>"
        f"<td class='num'>{r['passed']}</td>"
        + "".join(f"<td class='num'>{r[k]:.3f}</td>" if k in r else "<td>-</td>" for k in ks)
        + "</tr>"
        for r in summary["groups"][:200]
    )
    more = len(summary["groups"]) - 200
    tail = f"<p>... and {more} more groups</p>" if more > 0 else ""
    return (
        f"<p>over {len(summary['groups'])} groups: {overall or 'n/a'}</p>"
        + _plot(plots.pass_at_k(data), "pass_at_k")
        + f"<table>{head}{rows}</table>{tail}"
    )


def render(data: ReportData) -> str:
    statuses = ", ".join(f"{_e(k)} {v}" for k, v in data.statuses.most_common())
    slowest = [row for _, _, row in sorted(data.slowest, key=lambda e: e[:2], reverse=True)]
    invalid = f", {data.invalid} invalid input lines" if data.invalid else ""
    failing_note = (
        f" (the first {len(data.failing)} of {data.failing_total})"
        if data.failing_total > len(data.failing)
        else ""
    )
    verdicts = ""
    if data.verdicts:
        said = ", ".join(f"{_e(k)} {v}" for k, v in data.verdicts.most_common())
        verdicts = f" Eval verdicts (the harness's, not the exit code): {said}."
    made = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<title>sandfarm report: {_e(data.source)}</title><style>{STYLE}</style></head>
<body>
<h1>sandfarm report: {_e(data.source)}</h1>
<p>{data.jobs} jobs{invalid}: {statuses or "none"}.{verdicts} Made {made}.</p>
<h2>Status mix</h2>
<div class="plots">{_plot(plots.status_mix(data), "status_mix")}</div>
<h2>Time by backend</h2>
<div class="plots">{_plot(plots.histograms(data.run_ms, "run time"), "run_time")}
{_plot(plots.histograms(data.queue_wait_ms, "queue wait"), "queue_wait")}
{_plot(plots.phases(data), "phases")}</div>
<h2>Pass@k per task group</h2>
{_groups(data)}
<h2>Slowest jobs</h2>
{_jobs(slowest)}
<h2>Failing jobs{failing_note}</h2>
{_jobs(data.failing)}
</body></html>
"""
