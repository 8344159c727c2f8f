"""Redis Sentinel failover on hosts of a network (tests/netkit.py): a primary, a replica
and three sentinels; the farm (workers, client) configured with a sentinel:// URL; the
primary SIGKILLed mid-batch. The farm fails over and finishes; the figures say how many
jobs were lost, run twice or stored twice, and how long the failover took."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.farmkit import Farm, wait_for
from tests.netfarm import (
    FAST,
    check_all,
    counters,
    done_count,
    elapsed,
    figures,
    jobs,
    results_once,
    submit,
)
from tests.netkit import (
    Network,
    RedisHost,
    SentinelHost,
    network,
    require_netns,
    start_worker_on,
)

pytestmark = [pytest.mark.netns, pytest.mark.timeout(240)]


@pytest.fixture
def sentinel_hosts(is_root: bool) -> Iterator[Network]:
    from tests.conftest import require

    require_netns(is_root)
    import shutil

    require(shutil.which("redis-sentinel") is not None, "redis-sentinel is not installed")
    with network(["broker", "replica", "w1", "w2", "client"]) as net:
        yield net


def test_primary_killed_mid_batch_fails_over(sentinel_hosts: Network, tmp_path: Path) -> None:
    net = sentinel_hosts
    primary = RedisHost(net["broker"], tmp_path)
    primary.start()
    replica = RedisHost(net["replica"], tmp_path, 6379, "--replicaof", primary.host.address, "6379")
    replica.start()
    sentinels = [
        SentinelHost(net[role], tmp_path, primary) for role in ("broker", "replica", "client")
    ]
    for sentinel in sentinels:
        sentinel.start()
    url = "sentinel://" + ",".join(s.address for s in sentinels) + "/farm"
    farm = Farm(url, tmp_path, dict(FAST))
    try:
        wait_for(lambda: all(s.ready() for s in sentinels), 60, 0.2, "sentinels see each other")
        # a failover to a replica that has no copy yet loses everything (seen in CI: the
        # batch was queued and the primary killed inside the replica's first 5 s)
        wait_for(replica.synced, 60, 0.2, "the replica holds the primary's data")
        start_worker_on(farm, net["w1"], "w1")
        start_worker_on(farm, net["w2"], "w2")
        ids = submit(net, farm, jobs(40, "sent", 0.3))
        wait_for(lambda: done_count(net, farm, ids) >= 6, 60, 0.2, "a few jobs done")
        old = f"{primary.host.address}:{primary.port}"
        primary.kill()
        killed_at = time.monotonic()
        new = f"{replica.host.address}:{replica.port}"
        wait_for(lambda: sentinels[-1].primary() == new, 60, 0.1, "the replica promoted")
        failover = elapsed(killed_at)
        results = results_once(net["client"], farm, ids, 150)
        done = elapsed(killed_at)

        def on_new_primary() -> tuple[int, int]:
            client = redis.Redis.from_url(replica.url)
            keys = farm.settings.keys
            qids = [f"{farm.settings.client_tenant}/{i}" for i in ids]
            stored = client.mget([keys.result(q) for q in qids])
            attempts = client.mget([keys.attempts(q) for q in qids])
            client.close()
            missing = sum(v is None for v in stored)
            twice = sum(n is not None and int(n) > 1 for n in attempts)
            return missing, twice

        missing, ran_twice = net["client"].call(on_new_primary)
        seen = counters(net["client"], farm)
        figures(
            "sentinel-failover",
            jobs=len(ids),
            primary=f"{old}->{new}",
            lost=missing,
            stored_twice=0,  # collect_once: one result per id, or it fails
            # async replication: a delivery (BRPOP) the replica had not seen yet is
            # delivered again by the new primary; the job runs twice, its second result
            # is refused by the store script
            attempts_over_1=ran_twice,
            second_results_refused=seen["duplicates"],
            failover_s=failover,
            batch_done_after_kill_s=done,
        )
        check_all(results, ids)
        assert missing == 0
    finally:
        farm.stop()
        for sentinel in sentinels:
            sentinel.stop()
        replica.stop()
        primary.stop()
