"""Batch runs: JobSpecs as JSONL in, one JobResult JSON per line out; resumable.

Each non-blank input line is one JobSpec. A line that is not JSON or not a valid spec
becomes ``{"line": N, "file": ..., "error": "<field>: <reason>"}`` in RESULTS (and a
message on stderr) while the valid lines still run. A line without an ``id`` gets one
derived from the file name, the line number and a hash of the line, so a rerun with the
same RESULTS skips every job already answered there (resume).

Input is read twice (once to validate and count, once to submit chunk by chunk), so
memory holds ids, not specs, whatever the size of the batch. At most ``window`` jobs
are in flight; results are appended and flushed one by one as they arrive, so a crash
loses nothing already received, and the farm's idempotent ids make the rerun safe.
"""

from __future__ import annotations

from producer.batch.lines import LineError, derive_id, job_ids_of, parse_line
from producer.batch.results import read_results
from producer.batch.run import BatchClient, BatchReport, print_summary, run_batch
from producer.batch.summary import Summary, percentile

__all__ = [
    "BatchClient",
    "BatchReport",
    "LineError",
    "Summary",
    "derive_id",
    "job_ids_of",
    "parse_line",
    "percentile",
    "print_summary",
    "read_results",
    "run_batch",
]
