"""A stored result's status and labels read from its ends (producer/protocol/result_fields.py)
agree with the whole result parsed, whatever its text holds: labels that look like the key,
labels too long for the first read, a result from an older layout. Real Redis."""

from __future__ import annotations

import uuid

from producer.protocol import connect
from producer.protocol.result_fields import TAIL_BYTES, summaries
from sandbox_core import JobResult, Status
from sandbox_core import defaults as d
from tests.farmkit import private_db

TRICKY = '"labels":{"status":"succeeded"}}'


def test_status_and_labels_match_the_whole_result(redis_url: str) -> None:
    with private_db(redis_url) as url:
        r = connect(url)
        tag = uuid.uuid4().hex[:6]
        longest = {
            f"k{i:02d}" + "\x01" * (d.MAX_LABEL_BYTES - 3): "\x02" * d.MAX_LABEL_BYTES
            for i in range(d.MAX_LABELS)
        }
        results = [
            JobResult(id="plain", status=Status.SUCCEEDED, labels={"a": "1"}),
            JobResult(id="tricky", status=Status.FAILED, message=TRICKY, labels={"x": TRICKY}),
            JobResult(id="long", status=Status.TIMED_OUT, labels=longest),
            JobResult(id="none", status=Status.CANCELLED),
            # a label named "labels" (a review found the first parser then read it whole)
            JobResult(id="named", status=Status.SUCCEEDED, labels={"team": "a", "labels": "x"}),
        ]
        keys = [f"{tag}:{res.id}" for res in results]
        for key, res in zip(keys, results, strict=True):
            r.set(key, res.model_dump_json())
        assert r.strlen(keys[2]) > 4 * TAIL_BYTES  # read again, longer
        # another layout: read whole while small; when big, its status alone (if shown)
        r.set(f"{tag}:old", '{"labels": {"o": "1"}, "status": "error"}')
        big_old = '{"id":"b","status":"failed","message":"' + "x" * 1_000_000 + '"}'
        r.set(f"{tag}:big-old", big_old)

        got = summaries(r, [*keys, f"{tag}:old", f"{tag}:big-old", f"{tag}:missing"])

        expected = [(res.status.value, res.labels) for res in results]
        assert got == [*expected, ("error", {"o": "1"}), ("failed", {}), None]
        r.close()
