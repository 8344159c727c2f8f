"""Faults across a network: the farm on hosts (tests/netkit.py) — Redis on a broker host,
workers on two worker hosts, the client on a fourth — and the network between them
broken for real. Each test prints its figures: jobs lost, results duplicated, time to
recover."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sandbox_core import Status
from tests.farmkit import Farm, wait_for
from tests.netkit import (  # noqa: F401
    Network,
    RedisHost,
    counters,
    elapsed,
    hosts,
    results_once,
    start_worker_on,
)

pytestmark = [pytest.mark.netns, pytest.mark.timeout(240)]
FAST = {
    "SANDFARM_VISIBILITY_TIMEOUT_S": "6",  # a partitioned worker's jobs come back in ~8 s
    "SANDFARM_REAPER_INTERVAL_S": "1",
}


def jobs(n: int, tag: str, sleep: float = 0.5) -> list[dict]:
    return [
        {"id": f"{tag}-{i}", "command": f"sleep {sleep}; echo {i}", "limits": {"timeout_s": 5}}
        for i in range(n)
    ]


def submit(net: Network, farm: Farm, specs: list[dict]) -> list[str]:
    def go() -> list[str]:
        with farm.client() as client:
            return client.submit_many(specs)

    return net["client"].call(go)


def done_count(net: Network, farm: Farm, ids: list[str]) -> int:
    def count() -> int:
        with farm.client() as client:
            return len(client.results(ids))

    return net["client"].call(count)


def check_all(results: dict, ids: list[str]) -> None:
    for i, job_id in enumerate(ids):
        assert results[job_id].status == Status.SUCCEEDED, results[job_id]
        assert results[job_id].steps[0].stdout == f"{i}\n"


def figures(name: str, **values: object) -> None:
    print(f"\n[{name}] " + " ".join(f"{k}={v}" for k, v in values.items()), flush=True)


def test_farm_runs_across_hosts(hosts: Network, tmp_path: Path) -> None:  # noqa: F811
    broker = RedisHost(hosts["broker"], tmp_path)
    broker.start()
    farm = Farm(broker.url, tmp_path, dict(FAST))
    try:
        w1 = start_worker_on(farm, hosts["w1"], "w1")
        w2 = start_worker_on(farm, hosts["w2"], "w2")
        ids = submit(hosts, farm, jobs(12, "across", 0.3))
        results = results_once(hosts["client"], farm, ids, 60)
        check_all(results, ids)
        assert {r.worker for r in results.values()} == {w1.name, w2.name}
    finally:
        farm.stop()
        broker.stop()


def test_worker_host_partitioned_20s_mid_batch(hosts: Network, tmp_path: Path) -> None:  # noqa: F811
    broker = RedisHost(hosts["broker"], tmp_path)
    broker.start()
    farm = Farm(broker.url, tmp_path, dict(FAST))
    try:
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
    finally:
        farm.stop()
        broker.stop()


def test_broker_redis_killed_and_restarted_mid_batch(hosts: Network, tmp_path: Path) -> None:  # noqa: F811
    broker = RedisHost(hosts["broker"], tmp_path)
    broker.start()
    farm = Farm(broker.url, tmp_path, dict(FAST))
    try:
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
    finally:
        farm.stop()
        broker.stop()
