"""A farm script whose answer is lost after Redis ran it: the farm's own Redis client
(redis-py, patient) sends the same call again, through a loopback proxy that let Redis
run it and dropped the answer (tests/lostreply.py). The resend must find its own work
done: one stored result, counted, announced and published once; a chain step hands back
the job it took, never a second."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from producer.client import FarmClient
from producer.protocol import margins
from producer.protocol.connection import connect
from producer.protocol.scripts import ChainStep, FarmScripts, source, utc_day
from sandbox_core import JobResult
from tests.integration.test_chain_protocol import (  # noqa: F401
    RUNNING,
    done,
    farm,
    finish,
    one_begun_job,
    queued_ids,
    stat,
)
from tests.lostreply import lost_reply

T = TypeVar("T")


def jobs_counted(client: FarmClient) -> int:
    """Final results the farm's counters hold (every ``jobs|tenant|backend|status``)."""
    stats = client.redis.hgetall(client.keys.stats)
    return sum(int(v) for k, v in stats.items() if k.startswith(b"jobs|"))


def answer_lost(client: FarmClient, call: Callable[[FarmScripts], T]) -> T:
    """What ``call`` returns through the farm's own (retrying) Redis client when Redis runs
    its script and the answer is lost: the same call is sent again, and answered."""
    for name in ("store_result", "finish_job"):  # cached: the lost answer is the script's
        client.redis.script_load(source(name))
    with lost_reply(client.settings.redis_url) as proxy:
        via_proxy = connect(proxy.url)
        try:
            proxy.arm()
            answer = call(FarmScripts(via_proxy, client.settings))
        finally:
            via_proxy.close()
    # the fault happened: Redis ran it, its answer was lost, the same call came again
    assert proxy.intercepted == 1 and proxy.forwarded == 2
    return answer


def test_a_store_whose_answer_was_lost_is_retried_and_no_duplicate(farm) -> None:  # noqa: F811
    client, scripts = farm
    qid, tenant, result = one_begun_job(client, scripts)
    notify = client.keys.done("me")
    assert answer_lost(client, lambda s: s.store_result(result, notify, qid, tenant))
    stored = client.redis.get(client.keys.result(qid))
    assert stored is not None and JobResult.model_validate_json(stored).id == result.id
    # ... and it is one stored result: nothing counted, announced or charged twice
    assert client.redis.get(client.keys.duplicates) is None
    assert client.redis.lrange(notify, 0, -1) == [qid.encode()]
    assert jobs_counted(client) == 1
    assert client.redis.hget(client.keys.usage(tenant, utc_day()), "jobs") == b"1"
    # the token lives while a retry may come, not as long as the result
    assert 0 < client.redis.ttl(client.keys.stored_by(qid)) <= margins.STORE_TOKEN_TTL_S

    # Another run's result (a redelivery's) is the duplicate: refused and counted.
    assert not scripts.store_result(done(qid), notify, qid, tenant)
    assert int(client.redis.get(client.keys.duplicates)) == 1
    assert client.redis.get(client.keys.result(qid)) == stored
    assert client.redis.lrange(notify, 0, -1) == [qid.encode()] and jobs_counted(client) == 1


def test_a_chain_step_whose_answer_was_lost_publishes_its_events_once(farm) -> None:  # noqa: F811
    client, scripts = farm
    root, tenant, _ = one_begun_job(client, scripts)
    client.submit_many([{"command": "echo 1"}])
    _, taken = finish(scripts, root, root, "tok")
    assert taken is not None  # the chain's second job, whose events the chain publishes
    channel = f"events-{uuid.uuid4().hex[:6]}"
    listener = client.redis.pubsub()
    listener.subscribe(channel)
    assert listener.get_message(timeout=2)["type"] == "subscribe"  # listening from here
    step = ChainStep(root, "tok", False, 600.0, RUNNING, (channel, "task-succeeded"))
    result = done(taken.qid)
    answer = answer_lost(
        client, lambda s: s.finish_job(result, None, taken.qid, tenant, None, step)
    )
    assert answer == (True, None)
    assert not client.redis.exists(client.keys.chain(root))  # the chain ended, once
    published = []
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        if (message := listener.get_message(timeout=0.1)) is not None:
            published.append(message["data"])
    listener.close()
    assert published == [b"task-succeeded"]
    assert client.redis.get(client.keys.duplicates) is None
    assert jobs_counted(client) == 2  # the root's result and this one


def test_a_chain_step_that_took_a_job_and_lost_its_answer_hands_it_again(farm) -> None:  # noqa: F811
    client, scripts = farm
    root, tenant, result = one_begun_job(client, scripts)
    client.submit_many([{"command": "echo 1"}, {"command": "echo 2"}])
    step = ChainStep(root, "tok", True, 600.0, RUNNING)
    stored, taken = answer_lost(
        client, lambda s: s.finish_job(result, None, root, tenant, None, step)
    )
    # the first send took the next job; its resend hands that one, says it stored, and
    # takes nothing more
    assert stored and taken is not None
    assert client.redis.hget(client.keys.chain(root), "q") == taken.qid.encode()
    assert int(client.redis.get(client.keys.attempts(taken.qid))) == 1
    assert len(queued_ids(client)) == 1 and stat(client, "chained") == 1
    assert client.redis.get(client.keys.duplicates) is None and jobs_counted(client) == 1
