"""A stored result's status and labels, read without the rest of it.

A result is stored as ``JobResult.model_dump_json()``: compact, its fields in declared
order. Its status is in the first bytes (after the id: a job id, never escaped) and its
labels are the last field. So a listing of 200 jobs reads a few KB of each of 200 results,
not 200 results of up to tens of MiB each (an attack review's finding: a page of big
results made the gateway hold gigabytes). Inside a JSON string every quote is escaped,
so the bytes '"labels":{' occur only as a key whose value is an object: a label's value
is a string (a label named "labels" reads '"labels":"'), so the last of them is
JobResult's own. No tenant's text can make a listing read a result whole.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from typing import Any

import redis

from sandbox_core import JobResult
from sandbox_core import defaults as d

HEAD_BYTES = 256  # '{"id":"<at most 128 B>","status":"<word>"'
TAIL_BYTES = 4096  # the labels of almost every job
# the longest labels can be as JSON: every byte of every key and value as \uXXXX
LONGEST_LABELS = d.MAX_LABELS * (2 * d.MAX_LABEL_BYTES * 6 + 8) + 64
STATUS_RE = re.compile(rb'"status":"([a-z_]+)"')
LABELS_KEY = b'"labels":'
LABELS_OBJECT = LABELS_KEY + b"{"

Summary = tuple[str, dict[str, str]]  # (status, labels)


def summaries(client: redis.Redis, keys: Sequence[str]) -> list[Summary | None]:
    """(status, labels) of the result stored at each of ``keys``; None where none is.
    Never reads more than HEAD_BYTES + LONGEST_LABELS of one result."""
    found: list[Summary | None] = [None] * len(keys)
    missing = list(range(len(keys)))
    for tail in (TAIL_BYTES, LONGEST_LABELS):
        if not missing:
            break
        pipe = client.pipeline(transaction=False)
        for i in missing:
            pipe.getrange(keys[i], 0, HEAD_BYTES - 1)
            pipe.getrange(keys[i], -tail, -1)
        replies: list[Any] = pipe.execute()
        left = []
        for n, i in enumerate(missing):
            head, end = replies[2 * n], replies[2 * n + 1]
            if not head:
                continue  # no result (not final, or expired)
            found[i] = _parse(head, end)
            if found[i] is None and tail == LONGEST_LABELS:
                found[i] = _other_layout(head, end, whole=len(end) < tail)
            elif found[i] is None:
                left.append(i)
        missing = left
    return found


def _other_layout(head: bytes, end: bytes, whole: bool) -> Summary | None:
    """Not the layout above (a result stored by an older farm): read whole when the last
    read held all of it; else its status alone, if the head shows it."""
    if whole:
        with contextlib.suppress(ValueError):
            result = JobResult.model_validate_json(end)
            return result.status.value, result.labels
    status = STATUS_RE.search(head)
    return (status.group(1).decode(), {}) if status else None


def _parse(head: bytes, tail: bytes) -> Summary | None:
    status = STATUS_RE.search(head)
    at = tail.rfind(LABELS_OBJECT)
    if status is None or at < 0 or not tail.endswith(b"}"):
        return None
    try:
        labels = json.loads(tail[at + len(LABELS_KEY) : -1])
    except ValueError:
        return None
    if not isinstance(labels, dict):
        return None
    return status.group(1).decode(), {str(k): str(v) for k, v in labels.items()}
