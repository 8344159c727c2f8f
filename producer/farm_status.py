"""The farm at a glance, from Redis: the Celery queue, the workers online (fresh
heartbeats), jobs in flight, and each tenant's waiting and running jobs."""

from __future__ import annotations

import time
from typing import Any

import redis

from producer.protocol import KOMBU_UNACKED, Heartbeat, Settings, margins
from producer.protocol.records import redis_clock
from producer.protocol.scripts import utc_day
from producer.protocol.tenant_store import text


def farm_status(client: redis.Redis, settings: Settings) -> dict[str, Any]:
    keys = settings.keys
    now = time.time()
    beat_now = redis_clock(client)  # heartbeats are stamped with Redis's clock
    pipe = client.pipeline(transaction=False)
    pipe.llen(settings.queue)
    pipe.hlen(KOMBU_UNACKED)
    pipe.zremrangebyscore(keys.in_flight, "-inf", now)
    pipe.zcard(keys.in_flight)
    pipe.hgetall(keys.workers)
    pipe.get(keys.duplicates)
    pipe.smembers(keys.tenants)
    pipe.smembers(keys.ready)
    queued, unacked, _, in_flight, beats, duplicates, tenants, ready = pipe.execute()
    workers = []
    for name, raw in sorted(beats.items()):
        beat = Heartbeat.model_validate_json(raw)
        age = beat_now - beat.ts
        if age <= margins.heartbeat_stale_after(beat.interval_s):
            info = beat.model_dump(mode="json")
            workers.append({"name": text(name), **info, "age_s": round(age, 1)})
    names = sorted({text(t) for t in tenants} | {text(t) for t in ready})
    pipe = client.pipeline(transaction=False)
    day = utc_day()
    for name in names:
        pipe.llen(keys.pending(name))
        pipe.zcard(keys.active(name))
        pipe.hgetall(keys.usage(name, day))
    counts = pipe.execute()
    per_tenant = {
        name: {
            "waiting": counts[3 * i],
            "dispatched": counts[3 * i + 1],
            "today": {text(k): float(v) for k, v in counts[3 * i + 2].items()},
        }
        for i, name in enumerate(names)
    }
    return {
        "queue": settings.queue,
        "queued": queued,
        "delivered_unacked": unacked,
        "in_flight": in_flight,
        "workers_online": len(workers),
        "workers": workers,
        "duplicates": int(duplicates or 0),
        "tenants": per_tenant,
    }
