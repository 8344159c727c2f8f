"""The farm on hosts of a network (tests/netkit.py): a batch sent and read on the
client host, and the figures each fault test prints (lost, duplicated, recovery)."""

from __future__ import annotations

import time
from typing import Any

from producer.protocol import connect
from sandbox_core import Status
from tests.farmkit import Farm
from tests.netkit import Host, Network

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


def results_once(host: Host, farm: Farm, ids: list[str], timeout: float) -> dict[str, Any]:
    """Every job's result, read on ``host``; the figures of what went wrong."""
    from tests.farmkit import collect_once

    def collect() -> dict[str, Any]:
        with farm.client() as client:
            return collect_once(client, ids, timeout, farm)

    return host.call(collect)


def counters(host: Host, farm: Farm) -> dict[str, int]:
    """The farm's duplicate and redelivery counts, read on ``host``."""

    def read() -> dict[str, int]:
        keys = farm.settings.keys
        client = connect(farm.settings.redis_url)  # sentinel:// too
        try:
            duplicates = int(client.get(keys.duplicates) or 0)
            redeliveries = int(client.hget(keys.stats, "redeliveries") or 0)
        finally:
            client.close()
        return {"duplicates": duplicates, "redeliveries": redeliveries}

    return host.call(read)


def elapsed(since: float) -> float:
    return round(time.monotonic() - since, 1)
