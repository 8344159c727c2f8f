"""A delivery Redis forgets: a worker's BRPOP took the message, and Redis died before
kombu's next round trip wrote it to the unacked hash (seen once in CI as a job never
finished after a Redis SIGKILL). The test plays that worker: it pops the dispatched
message itself and drops it, so the message is in no queue and no unacked hash, then a
real worker joins. Dispatch's recovery must push it again, once, and must leave alone a
message that is only slow (still queued, or delivered and not begun yet). Last, the
order dispatch pushes in (the same ghost-worker setup)."""

from __future__ import annotations

import json
import time

import pytest

from producer.client import FarmClient
from producer.protocol.keys import KOMBU_UNACKED
from sandbox_core import Status
from tests.farmkit import Farm, announce_worker, farm_db, make_farm  # noqa: F401

pytestmark = pytest.mark.timeout(120)

VISIBILITY_S = 6
FAST = {"SANDFARM_VISIBILITY_TIMEOUT_S": str(VISIBILITY_S), "SANDFARM_REAPER_INTERVAL_S": "1"}
GHOST = "ghost@nowhere"


def ghost_worker(client: FarmClient, slots: int) -> None:
    """A heartbeat of a worker that consumes the queue but is this test: dispatch sees
    room and moves jobs into the Celery queue, where only the test takes them."""
    announce_worker(client.redis, client.settings, slots, GHOST, interval_s=1.0)
    client.redis.expire(client.keys.workers, 60)


def recovered(client: FarmClient) -> int:
    return int(client.redis.hget(client.keys.stats, "recovered") or 0)


def test_delivery_forgotten_by_redis_is_pushed_again_and_runs_once(make_farm) -> None:  # noqa: F811
    farm: Farm = make_farm(**FAST)
    with farm.client() as client:
        queue = client.settings.queue
        ghost_worker(client, 1)
        job_id = client.submit({"command": "echo found"})
        qid = client.jobs.qid(job_id)
        assert client.redis.llen(queue) == 1  # dispatched
        # the attack: the delivery happens and is forgotten (no unacked entry)
        raw = client.redis.rpop(queue)
        assert raw is not None and json.loads(raw)["headers"]["id"] == qid
        tag = json.loads(raw)["properties"]["delivery_tag"]
        assert client.redis.llen(queue) == 0
        assert not client.redis.hexists(KOMBU_UNACKED, tag)
        assert client.redis.exists(client.keys.message(qid))  # kept until a worker begins
        farm.start_worker("heir", 1)
        client.redis.hdel(client.keys.workers, GHOST)
        result = client.result(job_id, timeout=VISIBILITY_S + 30)
        assert result is not None, farm.logs()
        assert result.status == Status.SUCCEEDED
        assert result.steps[0].stdout == "found\n"
        assert result.attempts == 1  # pushed again once, run once
        assert recovered(client) == 1
        assert not client.redis.exists(client.keys.message(qid))  # begun: gone


def test_slow_delivery_is_not_pushed_twice(make_farm) -> None:  # noqa: F811
    """Past a visibility timeout, a message still in the Celery queue, one delivered but
    not begun, and one kombu restored (re-serialised: other bytes, same task) are where
    they should be: none is pushed again, all still count as dispatched (room is not
    given away twice)."""
    farm: Farm = make_farm(**FAST)
    with farm.client() as client:
        queue = client.settings.queue
        ghost_worker(client, 2)
        ids = client.submit_many([{"command": "true"} for _ in range(3)])
        qids = [client.jobs.qid(i) for i in ids]
        assert client.redis.llen(queue) == 3
        # the first: delivered to the ghost, as kombu records a delivery
        raw = client.redis.rpop(queue)
        assert raw is not None
        message = json.loads(raw)
        tag = message["properties"]["delivery_tag"]
        client.redis.hset(KOMBU_UNACKED, tag, json.dumps([message, "", queue]))
        # the second: restored by kombu, which marks and re-serialises it
        raw = client.redis.rpop(queue)
        assert raw is not None
        restored = json.loads(raw)
        restored["properties"]["delivery_info"]["redelivered"] = True
        client.redis.rpush(queue, json.dumps(restored))  # kombu's separators, not ours
        assert client.redis.lpos(queue, raw) is None  # not byte-equal any more
        try:
            in_queue = client.redis.llen(queue)
            deadline = time.monotonic() + VISIBILITY_S + 2
            while time.monotonic() < deadline:  # the dispatch entries expire meanwhile
                ghost_worker(client, 2)
                time.sleep(0.5)
            client.dispatch()  # what every reaper runs each second
            for qid in qids:
                assert client.redis.zscore(client.keys.active_all, qid) is not None
            assert recovered(client) == 0
            assert client.redis.llen(queue) == in_queue
            assert all(client.redis.exists(client.keys.message(q)) for q in qids)
        finally:
            client.redis.hdel(KOMBU_UNACKED, tag)
            client.redis.hdel(client.keys.workers, GHOST)


def test_idle_tenant_goes_to_the_front_of_the_celery_queue(make_farm) -> None:  # noqa: F811
    """Workers BRPOP from the right: a job of a tenant with nothing dispatched is pushed
    there (runs at the next free slot); a busy tenant's jobs keep their FIFO order."""
    from producer.jobs import TenantJobs
    from producer.protocol.tenant_store import TenantStore
    from producer.protocol.tenants import Policy
    from sandbox_core import parse_spec

    farm: Farm = make_farm(**FAST)
    with farm.client() as client:
        queue = client.settings.queue
        ghost_worker(client, 2)  # room: 2 slots + the margin (2)
        TenantStore(client.redis, client.keys).add("idle-b", Policy())
        ids = client.submit_many([{"id": f"busy-{i}", "command": "true"} for i in range(3)])
        assert client.redis.llen(queue) == 3  # the busy tenant's, dispatched
        other = TenantJobs(client.redis, client.settings, "idle-b")
        other.submit([parse_spec({"id": "b-0", "command": "true"})], None, all_or_nothing=True)
        assert client.redis.llen(queue) == 4
        order = [json.loads(raw)["headers"]["id"] for raw in client.redis.lrange(queue, 0, -1)]
        popped_first = order[::-1]  # BRPOP takes the right end first
        assert popped_first[0] == "idle-b/b-0"
        assert popped_first[1:] == [client.jobs.qid(i) for i in ids]  # FIFO, after the first
        client.redis.hdel(client.keys.workers, GHOST)
