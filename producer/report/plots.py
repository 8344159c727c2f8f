"""The report's plots as inline SVG (matplotlib's Agg backend: no display, no files).
Text from jobs (group names) is clipped; matplotlib escapes it in the SVG."""

from __future__ import annotations

import io
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from producer.report.data import ReportData

matplotlib.rcParams.update(
    # parse_math off: a job's label like "$\\frac$" is text, not mathtext to fail on
    {"svg.fonttype": "path", "svg.hashsalt": "sandfarm", "font.size": 9, "text.parse_math": False}
)
STATUS_COLORS = {
    "succeeded": "#2e7d32",
    "failed": "#c62828",
    "wrong_answer": "#ef6c00",
    "timed_out": "#f9a825",
    "memory_exceeded": "#6a1b9a",
    "output_flooded": "#8e24aa",
    "crashed": "#b71c1c",
    "rejected": "#9e9d24",
    "error": "#424242",
    "cancelled": "#9e9e9e",
}
MAX_BARS = 40
MAX_NAME = 24


def _svg(fig: Figure) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # no XML prolog or doctype inside HTML


def status_mix(data: ReportData) -> str:
    fig, ax = plt.subplots(figsize=(7, 2.6))
    names = [name for name, _ in data.statuses.most_common()]
    counts = [data.statuses[name] for name in names]
    ax.barh(names, counts, color=[STATUS_COLORS.get(n, "#607d8b") for n in names])
    ax.invert_yaxis()
    ax.set_xlabel("jobs")
    ax.set_title("status mix")
    for y, count in enumerate(counts):
        ax.text(count, y, f" {count}", va="center")
    return _svg(fig)


def histograms(by_backend: dict[str, list[float]], title: str) -> str:
    fig, ax = plt.subplots(figsize=(7, 2.8))
    drawn = False
    for backend, values in sorted(by_backend.items()):
        if values:
            seconds = [v / 1000 for v in values]
            ax.hist(seconds, bins=40, alpha=0.6, label=f"{backend} (n={len(values)})")
            drawn = True
    ax.set_xlabel("seconds")
    ax.set_ylabel("jobs")
    ax.set_title(title)
    if drawn:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "not measured (e.g. `sandfarm run`)", ha="center", transform=ax.transAxes)
    return _svg(fig)


def phases(data: ReportData) -> str:
    fig, ax = plt.subplots(figsize=(7, 2.6))
    names = [n for n, v in data.phases.items() if v]
    medians = [statistics.median(data.phases[n]) for n in names]
    ax.barh(names, medians, color="#1565c0")
    ax.invert_yaxis()
    ax.set_xlabel("median ms")
    ax.set_title("where a job's time goes (median per phase)")
    return _svg(fig)


def pass_at_k(data: ReportData) -> str | None:
    if data.groups is None or not data.groups.counts:
        return None
    rows = sorted(data.groups.counts.items())[:MAX_BARS]
    fig, ax = plt.subplots(figsize=(7, max(2.0, 0.22 * len(rows) + 1)))
    names = [name[:MAX_NAME] for name, _ in rows]
    rates = [c / n if n else 0.0 for _, (n, c) in rows]
    ax.barh(names, rates, color="#2e7d32")
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("pass@1 (share of jobs that succeeded)")
    ax.set_title(f"pass@1 per labels.{data.groups.label}")
    return _svg(fig)
