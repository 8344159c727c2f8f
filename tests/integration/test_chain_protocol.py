"""The chain's two steps (finish_job.lua, begin_attempt.lua) against a real Redis, with the
test as the worker: a slot that stores a result takes the message a worker's BRPOP would
take next; a retried step takes nothing twice; a redelivered message runs its chain's
job again and takes the chain over, so the old chain stops; a job that does not fit the
chain's time, or a message not ours, stays where it was; a job cancelled while queued is
consumed; a store sent again after its answer was lost is no duplicate. Workers, events
and faults are in test_chain_farm.py."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from typing import TypeVar

import pytest

from producer.client import FarmClient
from producer.protocol import RunningRecord, Settings
from producer.protocol.messages import task_message
from producer.protocol.scripts import ChainStep, Claimed, FarmScripts
from sandbox_core import JobResult, Status
from tests.farmkit import announce_worker, private_db

RUNNING = RunningRecord(worker="test@host", pid=1, slot=0)
T = TypeVar("T")


@pytest.fixture
def farm(redis_url: str):
    """A farm with no worker process, but one online by heartbeat (4 slots), so dispatch
    moves submitted jobs into its Celery queue: the test delivers them."""
    with private_db(redis_url) as url:
        tag = uuid.uuid4().hex[:6]
        settings = Settings(redis_url=url, queue=f"q-{tag}", key_prefix=f"c-{tag}:")
        client = FarmClient(settings=settings)
        announce_worker(client.redis, settings, 4)
        try:
            yield client, FarmScripts(client.redis, settings)
        finally:
            client.close()


def deliver(client: FarmClient) -> tuple[str, dict]:
    """BRPOP the next message, as a worker's consumer does: (qid, message)."""
    popped = client.redis.brpop([client.settings.queue], 5)
    assert popped is not None, "nothing dispatched"
    message = json.loads(popped[1])
    return message["headers"]["id"], message


def queued_ids(client: FarmClient) -> list[str]:
    """Task ids in the Celery queue, the next delivery last."""
    raw = client.redis.lrange(client.settings.queue, 0, -1)
    return [json.loads(m)["headers"]["id"] for m in raw]


def done(qid: str) -> JobResult:
    result = JobResult(id=qid.split("/")[1], status=Status.SUCCEEDED)
    result.timings.finished_at = datetime.now(UTC)
    return result


def finish(
    scripts: FarmScripts, qid: str, chain: str, token: str, **step
) -> tuple[bool, Claimed | None]:
    tenant = qid.split("/")[0]
    options = {"want_next": True, "room_s": 600.0, **step}
    return scripts.finish_job(
        done(qid), None, qid, tenant, None, ChainStep(chain, token, running=RUNNING, **options)
    )


def stat(client: FarmClient, name: str) -> int:
    return int(client.redis.hget(client.keys.stats, name) or 0)


def test_a_finishing_slot_takes_the_next_delivery_and_records_it(farm) -> None:
    client, scripts = farm
    ids = client.submit_many([{"command": f"echo {i}"} for i in range(6)])
    root, _ = deliver(client)
    assert root == client.jobs.qid(ids[0])
    first = scripts.begin_attempt(root, RUNNING, 30, "tok-1")
    assert first is not None and first.qid == root and first.message == "" and first.attempts == 1
    expected_next = queued_ids(client)[-1]  # what a worker's BRPOP would take now

    stored, claimed = finish(scripts, root, root, "tok-1")
    assert stored and claimed is not None
    assert claimed.qid == expected_next and claimed.attempts == 1 and not claimed.cancelled
    assert json.loads(claimed.message)["headers"]["id"] == claimed.qid
    assert claimed.qid not in queued_ids(client)  # taken, not delivered twice
    record = client.redis.hgetall(client.keys.chain(root))
    assert record[b"q"].decode() == claimed.qid and record[b"o"] == b"tok-1"
    assert client.redis.get(client.keys.running(claimed.qid)) is not None  # begun
    assert client.redis.get(client.keys.message(claimed.qid)) is None
    assert stat(client, "chained") == 1
    assert client.result(ids[0]) is not None

    # The chain ends when asked to: the job's result stored, the record gone.
    stored, after = finish(scripts, claimed.qid, root, "tok-1", want_next=False)
    assert stored and after is None
    assert not client.redis.exists(client.keys.chain(root))


def test_a_retried_step_hands_the_same_job_again(farm) -> None:
    client, scripts = farm
    client.submit_many([{"command": f"echo {i}"} for i in range(4)])
    root, _ = deliver(client)
    scripts.begin_attempt(root, RUNNING, 30, "tok")
    _, claimed = finish(scripts, root, root, "tok")
    assert claimed is not None
    waiting = queued_ids(client)
    # The same call again (its answer lost on the way back): nothing more is taken.
    _, again = finish(scripts, root, root, "tok")
    assert again is not None and again.qid == claimed.qid and again.message == claimed.message
    assert queued_ids(client) == waiting
    assert int(client.redis.get(client.keys.attempts(claimed.qid))) == 1
    assert stat(client, "chained") == 1


def test_a_redelivered_message_runs_its_chains_job_and_takes_the_chain_over(farm) -> None:
    client, scripts = farm
    client.submit_many([{"command": f"echo {i}"} for i in range(5)])
    root, _ = deliver(client)
    scripts.begin_attempt(root, RUNNING, 30, "old")
    _, running = finish(scripts, root, root, "old")
    assert running is not None
    # The slot dies mid-job: its message is delivered again, elsewhere.
    again = scripts.begin_attempt(root, RUNNING, 30, "new")
    assert again is not None and again.qid == running.qid and again.attempts == 2
    assert json.loads(again.message)["headers"]["id"] == running.qid
    assert client.redis.hget(client.keys.chain(root), "o") == b"new"
    assert stat(client, "redeliveries") == 1
    waiting = queued_ids(client)

    # The old chain, alive after all (its message came back on a lost connection), ends
    # at its next step: it stores and takes nothing.
    stored, nothing = finish(scripts, running.qid, root, "old")
    assert stored and nothing is None
    assert queued_ids(client) == waiting
    # The new owner's result is the duplicate; its chain goes on.
    stored, following = finish(scripts, running.qid, root, "new")
    assert not stored and following is not None and following.qid == waiting[-1]
    assert int(client.redis.get(client.keys.duplicates)) == 1

    # A message whose job and chain are all final runs nothing.
    finish(scripts, following.qid, root, "new", want_next=False)
    assert scripts.begin_attempt(root, RUNNING, 30, "third") is None


def test_what_the_chain_cannot_take_stays_where_it_was(farm) -> None:
    client, scripts = farm
    client.submit_many(
        [
            {"command": "echo a"},
            {"command": "echo b"},
            {"command": "echo c", "limits": {"timeout_s": 500}},
        ]
    )
    root, _ = deliver(client)
    scripts.begin_attempt(root, RUNNING, 30, "tok")
    long_job = queued_ids(client)[0]
    client.redis.rpush(client.settings.queue, client.redis.lpop(client.settings.queue))
    assert queued_ids(client)[-1] == long_job  # the next delivery
    # Its 500 s do not fit the 100 s the chain has left: it waits for a worker.
    stored, claimed = finish(scripts, root, root, "tok", room_s=100.0)
    assert stored and claimed is None
    assert queued_ids(client)[-1] == long_job
    assert not client.redis.exists(client.keys.chain(root))

    # A message that is not a farm job (another task, or not JSON) is left alone too.
    second, _ = deliver(client)
    assert second == long_job
    scripts.begin_attempt(second, RUNNING, 500, "tok2")
    queue = client.settings.queue
    for raw in (task_message("other.task", "x/1", [], queue, argsrepr="", time_limit=5), "{"):
        client.redis.rpush(queue, raw)
        stored, claimed = finish(scripts, second, second, "tok2")
        assert claimed is None
        assert client.redis.lindex(queue, -1).decode() == raw
        client.redis.rpop(queue)


def test_a_job_cancelled_while_queued_is_consumed_not_run(farm) -> None:
    client, scripts = farm
    ids = client.submit_many([{"command": f"echo {i}"} for i in range(4)])
    root, _ = deliver(client)
    scripts.begin_attempt(root, RUNNING, 30, "tok")
    next_qid = queued_ids(client)[-1]
    next_id = next_qid.split("/")[1]
    assert client.cancel(next_id)
    assert client.result(next_id).status == Status.CANCELLED
    _, claimed = finish(scripts, root, root, "tok")
    assert claimed is not None and claimed.qid != next_qid
    assert next_qid not in queued_ids(client)
    assert client.result(next_id).status == Status.CANCELLED  # its one result
    assert len(ids) == 4


def test_no_chain_key_outlives_its_ttl_unbounded(farm) -> None:
    client, scripts = farm
    client.submit_many([{"command": f"echo {i}"} for i in range(3)])
    root, _ = deliver(client)
    scripts.begin_attempt(root, RUNNING, 30, "tok")
    finish(scripts, root, root, "tok")
    ttl = client.redis.ttl(client.keys.chain(root))
    assert 0 < ttl <= 2 * client.settings.visibility_timeout + 3600


def test_a_chain_that_pops_a_dead_chains_message_runs_that_chains_job(farm) -> None:
    """A dead slot's message comes back into the queue (kombu's restore, a requeue) and
    the next to pop it is another slot's chain step, not a worker's delivery: the job the
    dead chain was running continues in that chain (review finding: it was dropped)."""
    client, scripts = farm
    client.submit_many([{"command": f"echo {i}"} for i in range(6)])
    root_raw = client.redis.lindex(client.settings.queue, -1)
    root, _ = deliver(client)
    scripts.begin_attempt(root, RUNNING, 30, "dead")
    _, running = finish(scripts, root, root, "dead")
    assert running is not None  # the dead chain's job
    other, _ = deliver(client)
    scripts.begin_attempt(other, RUNNING, 30, "alive")
    client.redis.rpush(client.settings.queue, root_raw)  # restored: the next pop
    stored, taken = finish(scripts, other, other, "alive")
    assert stored and taken is not None
    assert taken.qid == running.qid and taken.attempts == 2  # run again, counted
    assert root not in queued_ids(client)  # its message is done with
    assert not client.redis.exists(client.keys.chain(root))
    assert client.redis.hget(client.keys.chain(other), "q").decode() == running.qid
    waiting = queued_ids(client)
    # The dead chain, alive after all, stops at its step: it stores and takes nothing.
    stored, nothing = finish(scripts, running.qid, root, "dead")
    assert stored and nothing is None and queued_ids(client) == waiting
    stored, following = finish(scripts, running.qid, other, "alive")
    assert not stored and following is not None  # the duplicate; the chain goes on


def test_a_redelivered_message_whose_result_expired_runs_its_chains_job(farm) -> None:
    """The message's own result may be gone (a tenant's short result TTL) by the time it
    comes back: the chain's record, not the result, says what to run (review finding:
    the message's job ran twice and the chain's job was lost)."""
    client, scripts = farm
    client.submit_many([{"command": f"echo {i}"} for i in range(3)])
    root, _ = deliver(client)
    scripts.begin_attempt(root, RUNNING, 30, "old")
    _, running = finish(scripts, root, root, "old")
    assert running is not None
    client.redis.delete(client.keys.result(root))  # expired
    again = scripts.begin_attempt(root, RUNNING, 30, "new")
    assert again is not None and again.qid == running.qid and again.attempts == 2
    assert int(client.redis.get(client.keys.attempts(root))) == 1  # not run again


def test_after_a_takeover_ends_the_old_chain_takes_nothing(farm) -> None:
    """A chain taken over, still alive, must not start taking jobs again once the new
    owner's chain has ended and its record is gone (review finding)."""
    client, scripts = farm
    client.submit_many([{"command": f"echo {i}"} for i in range(6)])
    root, _ = deliver(client)
    scripts.begin_attempt(root, RUNNING, 30, "old")
    _, running = finish(scripts, root, root, "old")
    assert running is not None
    scripts.begin_attempt(root, RUNNING, 30, "new")  # the takeover
    finish(scripts, running.qid, root, "new", want_next=False)  # the new chain ends
    assert not client.redis.exists(client.keys.chain(root))
    waiting = queued_ids(client)
    stored, nothing = finish(scripts, running.qid, root, "old")
    assert nothing is None and queued_ids(client) == waiting
    assert not stored  # the new owner's result stands


def one_begun_job(client: FarmClient, scripts: FarmScripts) -> tuple[str, str, JobResult]:
    """A job submitted, delivered and begun (token "tok"): (qid, tenant, its result)."""
    client.submit_many([{"command": "echo 0"}])
    qid, _ = deliver(client)
    scripts.begin_attempt(qid, RUNNING, 30, "tok")
    return qid, qid.split("/")[0], done(qid)


def test_a_step_that_reaches_redis_late_has_that_much_less_room(farm) -> None:
    client, scripts = farm
    client.submit_many([{"command": "echo 0"}, {"command": "echo 1", "limits": {"timeout_s": 60}}])
    root, _ = deliver(client)
    scripts.begin_attempt(root, RUNNING, 30, "tok")
    waiting = queued_ids(client)
    # Room for the 60 s job when the worker measured it, 100 s before the step ran (a
    # retry after a lost connection): 120 - 100 s left, so it waits for a worker.
    late = time.time() - 100.0
    stored, claimed = finish(scripts, root, root, "tok", room_s=120.0, measured_at=late)
    assert stored and claimed is None
    assert queued_ids(client) == waiting and not client.redis.exists(client.keys.chain(root))

    # The same room measured just now: the chain takes it.
    second, _ = deliver(client)
    scripts.begin_attempt(second, RUNNING, 30, "tok2")
    (third,) = client.submit_many([{"command": "echo 2", "limits": {"timeout_s": 60}}])
    _, claimed = finish(scripts, second, second, "tok2", room_s=120.0)
    assert claimed is not None and claimed.qid == client.jobs.qid(third)


def test_a_jobs_record_lives_as_long_as_its_result(farm) -> None:
    """The record of an id's spec outlives its result, so the id with other code stays a
    conflict while the result can be read (it lived from submission, the result from
    storage: between the two, the id looked new and the old result answered new code)."""
    client, scripts = farm
    qid, tenant, result = one_begun_job(client, scripts)
    record = client.keys.job(qid)
    client.redis.expire(record, 5)  # what a short TTL leaves of it when the job ends
    assert scripts.store_result(result, None, qid, tenant)
    ttl = client.settings.result_ttl_s
    assert client.redis.ttl(client.keys.result(qid)) > ttl - 5
    assert client.redis.ttl(record) > ttl - 5  # ... now as long as the result's
