"""What a job's result keeps in Redis, as a tenant's result budget (result_mb_per_day)
counts it: lib_store.lua's kept_by, mirrored here for admission.

Admission charges each new job, in today's count, the least its result will keep: the
result a store past the budget writes (its id, status, labels and a message, no output)
and the job's keys. The store then counts what the result keeps less that charge
(lib_store.lua; a job stored on another day is counted whole there, its charge given
back), so a day's count is what its results keep plus the charges of jobs not stored
yet, and a backlog admitted under the budget cannot store past it (an attack review:
3,000 jobs queued before a 1 MiB budget ran out stored 2.7 MiB without output; with
16 KB labels, 20 MiB with 1,000 jobs). The charge leads the job's state record
(JobState.kept, then ``at``: its day), where both scripts read it.
"""

from __future__ import annotations

from pydantic_core import to_json

from sandbox_core import Status

# The lean result, as lib_store.lua's within_budget writes it, less its variable parts:
# the id, status, the budget in MiB and the labels' JSON (job ids need no escaping).
_LEAN_FRAME = len('{"id":"","status":"","message":"","labels":}')
_LEAN_MESSAGE = len(
    "output dropped: today's result budget ( MiB, result_mb_per_day) is stored already"
)
_LONGEST_STATUS = max(len(status.value) for status in Status)
# The budget's digits may grow before the job stores (a policy change): room for them.
_SLACK = 16


def allocated(size: int) -> int:
    """The bytes the allocator holds for a value of ``size``: jemalloc's size classes,
    four per doubling (lib_store.lua allocated)."""
    if size <= 64:
        return 64
    step = 1 << (size.bit_length() - 3)
    return -(-size // step) * step


def kept_by(payload_bytes: int, qid: str, prefix: str, notify: str | None) -> int:
    """What a stored result of ``payload_bytes`` keeps with its job's keys (lib_store.lua
    kept_by): 736 B of fixed keys, 7 B per character of the keys' names, and the submitting
    client's completion list."""
    client = 256 + 2 * len(notify) if notify else 0
    return allocated(payload_bytes + 16) + 736 + 7 * (len(qid) + len(prefix)) + client


def admission_charge(
    job_id: str,
    labels: dict[str, str],
    qid: str,
    prefix: str,
    notify: str | None,
    budget_mb: int,
) -> int:
    """What admission charges a job of today's result budget: what its result keeps at
    the least (stored without its output)."""
    lean = (
        _LEAN_FRAME
        + len(job_id)
        + _LONGEST_STATUS
        + _LEAN_MESSAGE
        + len(f"{budget_mb:.14g}")
        + len(to_json(labels))
        + _SLACK
    )
    return kept_by(lean, qid, prefix, notify)
