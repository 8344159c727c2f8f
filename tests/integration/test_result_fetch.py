"""Fetching many results never asks Redis for more than a bound at once: the real client
code against a real Redis."""

from __future__ import annotations

import uuid

import pytest

from producer.jobs import TenantJobs
from producer.protocol import Settings, connect
from sandbox_core import JobResult, Status
from tests.farmkit import private_db


def test_fetching_results_never_asks_redis_for_more_than_a_bound_at_once(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trusted client's results() fetched up to 1,000 results in one MGET, with no
    byte bound: Redis builds a reply whole in its own memory, and 40 results of 16 MiB
    took it 620 MB past its maxmemory, every other client's write refused meanwhile (a
    review). Sizes come first now, and each MGET carries at most FETCH_BYTES."""
    import producer.jobs

    with private_db(redis_url) as url:
        tag = uuid.uuid4().hex[:6]
        settings = Settings(redis_url=url, queue=f"q-{tag}", key_prefix=f"f-{tag}:")
        r = connect(url)
        team = TenantJobs(r, settings, "team")
        big = "x" * (3 << 20)
        for i in range(8):  # 8 results of ~3 MiB
            result = JobResult(id=f"j{i}", status=Status.SUCCEEDED, message=big)
            r.set(settings.keys.result(f"team/j{i}"), result.model_dump_json(), ex=600)
        monkeypatch.setattr(producer.jobs, "FETCH_BYTES", 7 << 20, raising=False)
        replies: list[int] = []
        real_mget = r.mget

        def counting_mget(keys, *args):
            values = real_mget(keys, *args)
            replies.append(sum(len(v) for v in values if v))
            return values

        monkeypatch.setattr(team.redis, "mget", counting_mget)
        found = team.results([f"j{i}" for i in range(8)] + ["none"])
        assert sorted(found) == [f"j{i}" for i in range(8)]
        assert len(replies) >= 4 and max(replies) <= 7 << 20, replies


AS_COMPLETED = """
import json, resource, sys
from producer.client import FarmClient
from producer.protocol import Settings
settings = Settings(**json.loads(sys.argv[1]))
ids = json.loads(sys.argv[2])
with FarmClient(settings=settings) as client:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    taken = sum(1 for _ in client.as_completed(ids, timeout=60))
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"taken": taken, "grown_mb": grown / 1024}))
"""


def test_taking_results_one_by_one_holds_a_chunk_not_them_all(redis_url: str) -> None:
    """as_completed built a dict of every stored result among its ids before yielding
    the first: a batch resumed over 200 results of 6 MB took the client 1.26 GB (an
    attack review, stop 39: jobs need only fill their output bounds). It takes them
    ITER_BYTES at a time now."""
    import json
    import subprocess
    import sys

    with private_db(redis_url) as url:
        tag = uuid.uuid4().hex[:6]
        fields = {"redis_url": url, "queue": f"q-{tag}", "key_prefix": f"f-{tag}:"}
        settings = Settings(**fields)
        r = connect(url)
        ids = [f"big-{i}" for i in range(40)]
        for job_id in ids:  # 40 results of 4 MB: 160 MB in all
            result = JobResult(id=job_id, status=Status.SUCCEEDED, message="y" * (4 << 20))
            r.set(settings.keys.result(f"trusted/{job_id}"), result.model_dump_json(), ex=600)
        ran = subprocess.run(
            [sys.executable, "-c", AS_COMPLETED, json.dumps(fields), json.dumps(ids)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ran.returncode == 0, ran.stderr[-3000:]
        seen = json.loads(ran.stdout)
        assert seen["taken"] == 40  # every result came
        assert seen["grown_mb"] < 60, seen  # not the 160 MB of them at once
