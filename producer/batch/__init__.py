"""Batch runs: JobSpecs as JSONL in, one JobResult JSON per line out; resumable.

Each non-blank input line is one JobSpec. A line that is not JSON or not a valid spec,
or whose id the farm already holds for a different spec, becomes ``{"line": N, "file":
..., "error": "<field>: <reason>"}`` in RESULTS (and a message on stderr) while the valid
lines still run. A line without an ``id`` gets one derived from the file name, the line
number, a hash of the line and the batch defaults it takes, so a rerun with the same
RESULTS skips every job already answered there (resume). ``id_prefix`` namespaces every
id of a batch, the lines' own too.

Input is read twice (once to validate and count, once to submit chunk by chunk), so
memory holds ids, not specs, whatever the size of the batch. At most ``window`` jobs
are in flight; results are appended and flushed one by one as they arrive, so a crash
loses nothing already received, and the farm's idempotent ids make the rerun safe.
"""

from __future__ import annotations

from producer.batch.lines import (
    STDIN_NAME,
    Defaults,
    LineError,
    derive_id,
    job_ids_of,
    parse_line,
    safe_prefix,
)
from producer.batch.progress import BatchProgress
from producer.batch.results import read_results
from producer.batch.run import BatchClient, BatchInput, BatchReport, print_summary, run_batch
from producer.batch.summary import Summary, percentile

__all__ = [
    "STDIN_NAME",
    "BatchClient",
    "BatchInput",
    "BatchProgress",
    "BatchReport",
    "Defaults",
    "LineError",
    "Summary",
    "derive_id",
    "job_ids_of",
    "parse_line",
    "percentile",
    "print_summary",
    "read_results",
    "run_batch",
    "safe_prefix",
]
