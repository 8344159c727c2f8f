"""Weighted fair share through the gateway: a small tenant's jobs are not stuck behind a
big tenant's backlog. Real gateway, real workers, quick real jobs."""

from __future__ import annotations

import statistics

import pytest

from producer.gateway_client import GatewayClient
from producer.protocol import connect
from sandbox_core import JobResult
from tests.farmkit import farm_db, make_farm  # noqa: F401
from tests.gatewaykit import tenant_farm  # noqa: F401

pytestmark = pytest.mark.timeout(300)
QUICK = {"command": "true"}


def latencies(results: list[JobResult]) -> list[float]:
    """Seconds from submission (the farm's own clock) to the stored result."""
    out = []
    for r in results:
        assert r.status.value == "succeeded", r
        assert r.timings.queued_at and r.timings.finished_at
        out.append((r.timings.finished_at - r.timings.queued_at).total_seconds())
    return out


def run_b(client: GatewayClient, tag: str) -> list[float]:
    ids = client.submit_many([{**QUICK, "id": f"{tag}-{i}"} for i in range(20)])
    return latencies(list(client.as_completed(ids, timeout=120)))


def test_small_tenant_is_not_stuck_behind_a_backlog(tenant_farm) -> None:  # noqa: F811
    tf = tenant_farm()
    farm = tf.farm
    farm.start_worker("fair", 2)
    gw = tf.start_gateway()
    a = GatewayClient(gw.url, tf.tenant("big-a"))
    b = GatewayClient(gw.url, tf.tenant("small-b"))
    r, keys = connect(farm.settings.redis_url), farm.settings.keys

    unloaded = statistics.median(run_b(b, "idle"))

    a.submit_many([{**QUICK, "id": f"a-{i}"} for i in range(2000)])
    assert r.llen(keys.pending("big-a")) > 1500  # the backlog waits its turn
    first = next(a.as_completed([f"a-{i}" for i in range(10)], timeout=60))
    assert first.status.value == "succeeded"  # A's jobs run: the farm is loaded

    loaded = statistics.median(run_b(b, "busy"))
    a_left = r.llen(keys.pending("big-a"))
    print(
        f"B p50 unloaded {unloaded * 1000:.0f} ms, loaded {loaded * 1000:.0f} ms;"
        f" A's jobs still waiting when B was done: {a_left}"
    )
    assert a_left > 1000, "B finished long before A's backlog"
    assert loaded <= 5 * unloaded, (loaded, unloaded)  # ~2x seen; ~100x without fair share
    cancelled, _ = tf.remove("big-a")  # the rest of the backlog is not needed
    assert cancelled > 0 and r.llen(keys.pending("big-a")) == 0
