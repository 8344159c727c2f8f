"""Faults across a network: the farm on hosts (tests/netkit.py) — Redis on a broker host,
workers on two worker hosts, the client on a fourth — and the network between them
broken for real. Each test prints its figures: jobs lost, results duplicated, time to
recover."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from producer.gateway_client import GatewayClient
from producer.protocol import connect
from producer.protocol.tenant_store import TenantStore
from producer.protocol.tenants import Policy
from tests.farmkit import Farm, wait_for
from tests.gatewaykit import Gateway, exactly_once, launch_gateway
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
from tests.netkit import (  # noqa: F401
    PREFIX,
    Host,
    Network,
    RedisHost,
    hosts,
    ip,
    remove_leftovers,
    require_netns,
    start_worker_on,
)

pytestmark = [pytest.mark.netns, pytest.mark.timeout(240)]


@pytest.fixture
def broker(hosts: Network, tmp_path: Path) -> Iterator[RedisHost]:  # noqa: F811
    """Redis (AOF) on the broker host, stopped after the test."""
    server = RedisHost(hosts["broker"], tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def farm(broker: RedisHost, tmp_path: Path) -> Iterator[Farm]:
    """A farm on that broker (its own queue and prefix); its workers stopped after."""
    on_broker = Farm(broker.url, tmp_path, dict(FAST))
    try:
        yield on_broker
    finally:
        on_broker.stop()


def test_farm_runs_across_hosts(hosts: Network, farm: Farm) -> None:  # noqa: F811
    w1 = start_worker_on(farm, hosts["w1"], "w1")
    w2 = start_worker_on(farm, hosts["w2"], "w2")
    ids = submit(hosts, farm, jobs(12, "across", 0.3))
    results = results_once(hosts["client"], farm, ids, 60)
    check_all(results, ids)
    assert {r.worker for r in results.values()} == {w1.name, w2.name}


def test_worker_host_partitioned_20s_mid_batch(hosts: Network, farm: Farm) -> None:  # noqa: F811
    w1 = start_worker_on(farm, hosts["w1"], "w1")
    start_worker_on(farm, hosts["w2"], "w2")
    ids = submit(hosts, farm, jobs(40, "part"))
    wait_for(lambda: done_count(hosts, farm, ids) >= 6, 60, 0.2, "a few jobs done")
    hosts["w1"].link_down()
    down_at, all_done = time.monotonic(), None
    while time.monotonic() - down_at < 20:  # the others carry on meanwhile
        if all_done is None and done_count(hosts, farm, ids) == len(ids):
            all_done = elapsed(down_at)
        time.sleep(0.5)
    hosts["w1"].link_up()
    up_at = time.monotonic()
    results = results_once(hosts["client"], farm, ids, 120)
    finished = elapsed(up_at)
    check_all(results, ids)

    # it rejoins: fresh beats again, and it takes jobs of a new batch
    def w1_runs() -> bool:
        more = submit(hosts, farm, jobs(8, f"after-{time.monotonic_ns()}", 1.0))
        late = results_once(hosts["client"], farm, more, 60)
        return any(r.worker == w1.name for r in late.values())

    wait_for(w1_runs, 90, 0.5, "the partitioned worker runs jobs again")
    rejoined = elapsed(up_at)
    seen = counters(hosts["client"], farm)
    lost = len(set(ids) - set(results))
    figures(
        "partition",
        jobs=len(ids),
        lost=lost,
        stored_twice=0,  # collect_once: one result per id, or it fails
        redeliveries=seen["redeliveries"],
        late_results_refused=seen["duplicates"],
        all_done_after_link_down_s=all_done,
        batch_done_after_link_up_s=finished,
        rejoined_after_link_up_s=rejoined,
    )
    assert lost == 0
    assert seen["redeliveries"] >= 1  # its jobs ran elsewhere meanwhile
    assert seen["duplicates"] >= 1  # and its own late results were refused
    assert w1.proc.poll() is None


def test_broker_redis_killed_and_restarted_mid_batch(
    hosts: Network,  # noqa: F811
    broker: RedisHost,
    farm: Farm,
) -> None:
    start_worker_on(farm, hosts["w1"], "w1")
    start_worker_on(farm, hosts["w2"], "w2")
    ids = submit(hosts, farm, jobs(40, "aof", 0.3))
    wait_for(lambda: done_count(hosts, farm, ids) >= 6, 60, 0.2, "a few jobs done")
    broker.kill()  # SIGKILL: only what the AOF holds comes back
    time.sleep(2)
    broker.start()
    up_at = time.monotonic()
    results = results_once(hosts["client"], farm, ids, 120)
    figures(
        "redis-restart",
        jobs=len(ids),
        lost=len(set(ids) - set(results)),
        duplicated=counters(hosts["client"], farm)["duplicates"],
        batch_done_after_restart_s=elapsed(up_at),
    )
    check_all(results, ids)


def start_gateway_on(host: Host, farm: Farm, port: int = 8000) -> Gateway:
    """A real `sandfarm gateway` on ``host``, listening on its address."""
    return launch_gateway(farm, host.address, port, host.command([]), host.call)


def test_gateway_replica_killed_mid_submit(hosts: Network, farm: Farm) -> None:  # noqa: F811
    admin = hosts["broker"]
    start_worker_on(farm, hosts["w1"], "w1")
    start_worker_on(farm, hosts["w2"], "w2")
    doomed = start_gateway_on(hosts["w1"], farm)
    other = start_gateway_on(hosts["w2"], farm)

    def make_tenant() -> str:
        store = TenantStore(connect(farm.settings.redis_url), farm.settings.keys)
        store.add("net", Policy())
        return store.create_key("net")[0]

    key = admin.call(make_tenant)
    r = admin.call(connect, farm.settings.redis_url)
    keys = farm.settings.keys
    ids = [f"g{i}" for i in range(600)]
    client = hosts["client"].call(GatewayClient, [doomed.url, other.url], key)
    sender = hosts["client"].pool.submit(
        client.submit_many, [{"command": "true", "id": i} for i in ids], batch=50
    )
    listed = lambda: admin.call(r.zcard, keys.joblist("net"))  # noqa: E731
    wait_for(lambda: listed() >= 150, 60, 0.05, "a quarter accepted")
    at_kill = listed()
    doomed.stop(signal.SIGKILL)  # requests to it are in flight
    killed_at = time.monotonic()
    wait_for(lambda: listed() > at_kill, 60, 0.05, "the other replica takes the rest")
    failover = elapsed(killed_at)
    assert sender.result(120) == ids  # the client's retries landed on the other
    done = hosts["client"].call(lambda: {res.id for res in client.as_completed(ids, timeout=120)})
    lost = len(set(ids) - done)
    doubled = admin.call(r.zcard, keys.joblist("net")) - len(ids)
    figures("gateway-kill", jobs=len(ids), lost=lost, doubled=doubled, failover_s=failover)
    admin.call(exactly_once, r, keys, "net", ids)
    assert lost == 0 and doubled == 0


def test_leftovers_of_a_crashed_run_are_removed(is_root: bool) -> None:
    """A run that died keeps its namespaces and links; the next run removes them (their
    test process is gone) and leaves those of live runs alone."""
    require_netns(is_root)
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid is free now: the "crashed run"
    dead, live = f"{PREFIX}{gone.pid}-w9", f"{PREFIX}{os.getpid()}-keep"
    link = f"{PREFIX}v{gone.pid}x9a"
    try:
        for name in (dead, live):
            ip("netns", "add", name)
        ip("link", "add", link, "type", "veth", "peer", "name", link[:-1] + "b")
        removed = remove_leftovers()
        names = ip("netns", "list").stdout
        assert dead in removed and link in removed and live not in removed
        assert dead not in names and live in names
        assert link not in ip("-o", "link", "show").stdout
    finally:
        for name in (dead, live):
            ip("netns", "del", name, check=False)
        ip("link", "del", link, check=False)
