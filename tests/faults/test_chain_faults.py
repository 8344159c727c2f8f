"""Faults in a chain (worker/chain.py): the job a slot took itself, as it stored the last
one's result, has no Celery message of its own; its chain's record does. Each test first
shows the job came by a chain (the record names it while it runs), kills something for
real, and checks that the job runs again and every job ends with exactly one result."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import time
from datetime import UTC, datetime

import pytest

from producer.protocol import MessageMeta, RunningRecord
from producer.protocol.scripts import ChainStep, FarmScripts, source
from sandbox_core import JobResult, Status
from tests.conftest import job_shared_dir
from tests.farmkit import (  # noqa: F401
    Farm,
    announce_worker,
    collect_once,
    farm_db,
    make_farm,
    private_db,
    wait_for,
)
from tests.lostreply import lost_reply

pytestmark = pytest.mark.timeout(150)

# Chains need room: a job is taken only if it ends 30 s before the visibility timeout.
CHAINING = {"SANDFARM_VISIBILITY_TIMEOUT_S": "40", "SANDFARM_REAPER_INTERVAL_S": "1"}


def chain_of(client, root_qid: str) -> dict[str, str]:
    raw = client.redis.hgetall(client.keys.chain(root_qid))
    return {k.decode(): v.decode() for k, v in raw.items()}


def running(client, job_id: str) -> dict | None:
    raw = client.redis.get(client.keys.running(client.jobs.qid(job_id)))
    return json.loads(raw) if raw else None


def submit_pair(client, marks) -> tuple[str, str]:
    """A quick job, then one the slot takes by its chain: it counts its runs in marks."""
    first, second = client.submit_many(
        [
            {"command": "true"},
            {
                "command": f"echo start >> {marks}/runs; sleep 2; echo done",
                "limits": {"timeout_s": 5},
            },
        ]
    )
    return first, second


def test_pool_process_killed_mid_chained_job_runs_it_again(make_farm) -> None:  # noqa: F811
    farm: Farm = make_farm(**CHAINING)
    worker = farm.start_worker("ck", 1)
    marks = job_shared_dir("sandfarm-chain-")
    marks.chmod(0o777)
    try:
        with farm.client() as client:
            first, second = submit_pair(client, marks)
            info = wait_for(lambda: running(client, second), 20, what="the second job running")
            record = chain_of(client, client.jobs.qid(first))
            assert record.get("q") == client.jobs.qid(second), record  # it came by a chain
            assert info["pid"] in worker.pool_pids()
            wait_for(lambda: (marks / "runs").exists(), 10, what="the job started")
            killed_at = time.monotonic()
            os.kill(info["pid"], signal.SIGKILL)
            result = client.result(second, timeout=40)
            assert result is not None, farm.logs()
            assert result.status == Status.SUCCEEDED, (result.message, farm.logs())
            assert result.steps[0].stdout == "done\n"
            assert result.attempts == 2
            # the chain's message is requeued at once (task_reject_on_worker_lost)
            assert time.monotonic() - killed_at < 30  # not after the 40 s visibility timeout
            assert (marks / "runs").read_text() == "start\nstart\n"
            assert client.result(first).status == Status.SUCCEEDED
            assert client.status()["duplicates"] == 0
            assert not client.redis.exists(client.keys.chain(client.jobs.qid(first)))
            assert worker.proc.poll() is None
    finally:
        shutil.rmtree(marks, ignore_errors=True)


def test_a_chain_step_answered_too_late_leaves_its_job_to_the_redelivery(make_farm) -> None:  # noqa: F811
    """The step that stores the first job and takes the second reaches Redis in time, but
    its answer comes back 6 s late (as a resend after a lost connection would): the 10 s
    the chain had (40 s visibility timeout - 30 s) no longer hold the second job's 5 s.
    The slot must not run it; the message goes back and its redelivery runs it."""
    farm: Farm = make_farm(**CHAINING)
    sha = hashlib.sha1(source("finish_job").encode()).hexdigest().encode()
    marks = job_shared_dir("sandfarm-chain-")
    marks.chmod(0o777)
    try:
        with lost_reply(farm.redis_url, sha) as proxy, farm.client() as client:
            proxy.arm(delay_s=6.0)
            worker = farm.start_worker("clate", 1, SANDFARM_REDIS_URL=proxy.url)
            first, second = submit_pair(client, marks)
            result = client.result(second, timeout=60)
            assert proxy.intercepted == 1  # the step's answer was held back
            assert result is not None, farm.logs()
            assert result.status == Status.SUCCEEDED, (result.message, farm.logs())
            assert result.attempts == 2  # taken by the late step, then run by the redelivery
            assert (marks / "runs").read_text() == "start\n"  # and run once
            assert "answer came late" in worker.log.read_text()
            assert client.result(first).status == Status.SUCCEEDED
            assert client.status()["duplicates"] == 0
    finally:
        shutil.rmtree(marks, ignore_errors=True)


def test_whole_worker_killed_mid_chained_job_another_runs_it(make_farm) -> None:  # noqa: F811
    farm: Farm = make_farm(**CHAINING)
    victim = farm.start_worker("cvictim", 1)
    marks = job_shared_dir("sandfarm-chain-")
    marks.chmod(0o777)
    try:
        with farm.client() as client:
            first, second = submit_pair(client, marks)
            wait_for(lambda: running(client, second), 20, what="the second job running")
            assert chain_of(client, client.jobs.qid(first)).get("q") == client.jobs.qid(second)
            wait_for(lambda: (marks / "runs").exists(), 10, what="the job started")
            victim.kill_all()
            survivor = farm.start_worker("csurvivor", 1)
            # the message comes back after the visibility timeout (40 s)
            results = collect_once(client, [first, second], 90, farm)
            assert results[second].status == Status.SUCCEEDED
            assert results[second].attempts == 2 and results[second].worker == survivor.name
            assert (marks / "runs").read_text() == "start\nstart\n"
            assert client.status()["duplicates"] == 0
    finally:
        shutil.rmtree(marks, ignore_errors=True)


def test_a_dead_chains_message_taken_by_another_chain_runs_its_job(make_farm) -> None:  # noqa: F811
    """The dead worker's message comes back while a survivor's slot is chaining: the
    survivor's chain step may pop it before any worker's own delivery does. The job the
    dead chain was running must still run (review finding: it was dropped). The message
    comes back as a lost host's does: the survivor's reaper gives it back once the dead
    worker's heartbeat is SANDFARM_WORKER_LOST_S old (worker/lostworkers.py), mid-chain
    (kombu's restore after the visibility timeout takes the same way back, 40 s later)."""
    farm: Farm = make_farm(**CHAINING, SANDFARM_WORKER_LOST_S="6")
    victim = farm.start_worker("dvictim", 1)
    with farm.client() as client:
        first, second = client.submit_many(
            [
                {"command": "true", "limits": {"timeout_s": 2}},
                {"command": "sleep 3; echo done", "limits": {"timeout_s": 8}},
            ]
        )
        root, held = client.jobs.qid(first), client.jobs.qid(second)
        wait_for(lambda: running(client, second), 20, what="the chain's job running")
        assert chain_of(client, root).get("q") == held  # it came by a chain
        # up before the victim's last beat could expire (a worker's beats keep the hash)
        survivor = farm.start_worker("dsurvivor", 1)
        # its reaper too (a host lost): else it gives the message back at once, before the
        # survivor chains
        reaper = victim.reaper_pid()
        assert reaper is not None
        os.kill(reaper, signal.SIGKILL)
        victim.kill_all()
        assert client.redis.hexists(client.keys.workers, victim.name)  # nothing gave it back
        # keep the survivor chaining past the give-back
        filler = client.submit_many(
            [{"command": "sleep 0.15", "limits": {"timeout_s": 2}} for _ in range(200)]
        )
        result = client.result(second, timeout=60)
        assert result is not None, farm.logs()
        assert result.status == Status.SUCCEEDED and result.attempts == 2
        assert result.steps[0].stdout == "done\n"
        assert client.status()["duplicates"] == 0
        assert chained(client) > 10 and len(filler) == 200
        assert f"{victim.name} lost" in survivor.log.read_text()  # came back by the give-back
        # ... while the survivor was still chaining fillers
        assert client.result(filler[-1]) is None


def chained(client) -> int:
    return int(client.redis.hget(client.keys.stats, "chained") or 0)


def test_a_hard_time_limit_ends_the_chained_job_with_error(redis_url: str) -> None:
    """Celery's hard limit kills the pool process and calls the task's on_failure in the
    worker's main process with the chain's first message: the job the chain was running
    gets its `error` result there (nothing else would ever run it)."""
    from producer.client import FarmClient
    from producer.protocol import Settings
    from worker import jobs, tasks

    with private_db(redis_url) as url:
        settings = Settings(redis_url=url, queue="q-hard", key_prefix="hard:")
        client = FarmClient(settings=settings)
        scripts = FarmScripts(client.redis, settings)
        announce_worker(client.redis, settings, 2)
        saved = jobs._client, jobs._scripts
        jobs._client, jobs._scripts = client.redis, scripts
        try:
            first, second = client.submit_many([{"command": "true"}, {"command": "sleep 9"}])
            root = client.jobs.qid(first)
            message = json.loads(client.redis.brpop([settings.queue], 5)[1])
            spec, raw_meta = json.loads(message["body"])[0]
            running_record = RunningRecord(worker="w", pid=1, slot=0)
            assert scripts.begin_attempt(root, running_record, 30, "tok") is not None
            done = JobResult(id=first, status=Status.SUCCEEDED)
            done.timings.finished_at = datetime.now(UTC)
            meta = MessageMeta.model_validate(raw_meta)
            step = ChainStep(root, "tok", True, 600.0, running_record)
            _, claimed = scripts.finish_job(done, None, root, meta.tenant, None, step)
            assert claimed is not None and claimed.qid == client.jobs.qid(second)
            assert client.result(second) is None  # running, in the chain
            from celery.exceptions import TimeLimitExceeded

            tasks.execute.on_failure(TimeLimitExceeded(120), root, [spec, raw_meta], {}, None)
            result = client.result(second)
            assert result is not None and result.status == Status.ERROR
            assert "TimeLimitExceeded" in (result.message or "")
            assert client.result(first).status == Status.SUCCEEDED  # its own stays
            assert not client.redis.exists(client.keys.chain(root))
        finally:
            jobs._client, jobs._scripts = saved
            client.close()
