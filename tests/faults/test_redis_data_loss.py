"""Redis loses the farm's data (restarted empty, flushed) while a job runs, and its id is
sent again with other code: the old run's result must not answer for it. A real worker
and a real Redis; the loss is a FLUSHDB of the farm's own database, which is what a
restart of a Redis that keeps nothing on disk leaves.

Before lib_store.lua checked a result against its job's record, the old run stored its
result under the new record, and the new code never ran: its submitter got `old`."""

from __future__ import annotations

import shutil

import pytest

from sandbox_core import Status
from tests.conftest import job_shared_dir
from tests.farmkit import Farm, farm_db, make_farm, wait_for  # noqa: F401

pytestmark = pytest.mark.timeout(90)


def test_a_run_redis_forgot_never_answers_for_the_code_its_id_names_now(make_farm) -> None:  # noqa: F811
    farm: Farm = make_farm(SANDFARM_REAPER_INTERVAL_S="1")
    farm.start_worker("loss", 1)
    marks = job_shared_dir("sandfarm-loss-")
    marks.chmod(0o777)
    try:
        with farm.client() as client:
            old = f"sleep 2; echo old >> {marks}/runs; echo old"
            client.submit({"id": "x", "command": old})
            qid = client.jobs.qid("x")
            wait_for(lambda: client.redis.exists(client.keys.running(qid)), 20, what="running")
            client.redis.flushdb()  # the farm's data is gone; the old run goes on
            client.submit({"id": "x", "command": "echo new"})  # a new job to Redis now
            result = client.result("x", timeout=40)
            assert result is not None, farm.logs()
            # the old run ended and tried to store its result: refused, counted
            wait_for(lambda: (marks / "runs").exists(), 20, what="the old run's end")
            assert (marks / "runs").read_text() == "old\n"
            assert result.status == Status.SUCCEEDED
            assert result.steps[0].stdout == "new\n"
            orphaned = wait_for(lambda: client.redis.hget(client.keys.stats, "orphaned"), 10)
            assert int(orphaned) == 1
    finally:
        shutil.rmtree(marks, ignore_errors=True)
