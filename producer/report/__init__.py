"""`sandfarm report`: one self-contained HTML page (inline SVG plots) from a RESULTS file."""

from producer.report.data import ReportData, load
from producer.report.page import render

__all__ = ["ReportData", "load", "render"]
