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
