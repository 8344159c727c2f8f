"""The trusted client's edges a reliability review found, on a real Redis (no worker)."""

from __future__ import annotations

import uuid

from producer.client import FarmClient
from producer.jobs import TenantJobs
from producer.protocol import FarmUnavailableError, Settings, connect
from sandbox_core import JobResult, Status
from tests.farmkit import private_db


def _settings(url: str, **more: object) -> Settings:
    tag = uuid.uuid4().hex[:6]
    return Settings(redis_url=url, queue=f"q-{tag}", key_prefix=f"f-{tag}:", **more)


def test_sdk_jobs_live_as_long_as_the_farms_result_ttl_says(redis_url: str) -> None:
    """SANDFARM_RESULT_TTL_S was ignored for SDK and CLI jobs: their tenant was made with
    the default policy's week (a review)."""
    with private_db(redis_url) as url:
        settings = _settings(url, result_ttl_s=120)
        with FarmClient(settings=settings) as client:
            job_id = client.submit({"command": "true"})
        r = connect(url)
        qid = f"{settings.client_tenant}/{job_id}"
        assert 0 < r.ttl(settings.keys.job(qid)) <= 120


def test_cancel_says_false_for_a_job_that_ended_first(redis_url: str, monkeypatch) -> None:
    """Cancel looked for a result, then stored its own: a job that ended between the two
    read "cancelled: True" and then succeeded (a review). The store decides now."""
    with private_db(redis_url) as url:
        settings = _settings(url)
        with FarmClient(settings=settings) as client:
            job_id = client.submit({"command": "true"})
        jobs = TenantJobs(connect(url), settings, settings.client_tenant)
        real = jobs.scripts.store_result
        qid = jobs.qid(job_id)

        def worker_first(*args: object, **kwargs: object) -> bool:
            done = JobResult(id=job_id, status=Status.SUCCEEDED)
            assert real(done, None, qid, settings.client_tenant, ttl=60)  # the job ends
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(jobs.scripts, "store_result", worker_first)
        assert jobs.cancel(job_id) is False
        assert jobs.result(job_id).status == Status.SUCCEEDED  # type: ignore[union-attr]


def test_an_unreachable_gateway_is_named_a_gateway() -> None:
    error = FarmUnavailableError("http://127.0.0.1:1", "no gateway answers (refused)")
    assert str(error).startswith("no gateway answers at http://127.0.0.1:1")
    assert str(FarmUnavailableError("redis://h:6379/0", "down")).startswith("no Redis answers")


def test_a_worker_whose_clock_is_behind_redis_stays_online(redis_url: str, monkeypatch) -> None:
    """Heartbeats were stamped with the worker host's clock and judged by Redis's: a host
    18 s behind looked gone, and dispatch stopped (a review). They carry Redis's time."""
    import types

    import worker.reaper as reaper
    from producer.farm_status import farm_status
    from producer.protocol import Heartbeat

    with private_db(redis_url) as url:
        settings = _settings(url)
        r = connect(url)
        behind = types.SimpleNamespace(**vars(reaper.time))
        behind.time = lambda: reaper.time.time() - 30  # type: ignore[attr-defined]
        monkeypatch.setattr(reaper, "time", behind)
        info = Heartbeat(
            pid=1,
            host="h",
            slots=(0, 1),
            uids=(None, None),
            concurrency=1,
            queues=(settings.queue,),
            interval_s=1.0,
        )
        reaper.beat(r, settings.keys.workers, "skewed", info, 60)
        names = [w["name"] for w in farm_status(r, settings)["workers"]]
        assert names == ["skewed"], names
