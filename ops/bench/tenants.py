"""Tenants: fair share under load, weights, the gateway's cost and the rate limit's
accuracy, each against a baseline measured in the same run.

1. Fair share: tenant B submits ``--b-jobs`` quick jobs at a steady rate, first on an
   idle farm, then while tenant A has a ``--backlog``-job backlog waiting.
   ``ratio.tenant_b_p50=<B's p50 latency loaded / unloaded>`` (target <= 2).
2. Weights 3:1, both tenants saturating: ``share.tenant_a=<A's fraction of the jobs
   completed in a window>`` (target 0.75 +- 0.05).
3. Gateway cost: the same ``--jobs`` jobs through GatewayClient (HTTP) and FarmClient
   (Redis), alternating rounds: ``ratio.gateway=<gateway jobs/s / direct jobs/s>``
   (target >= 0.9); and single-job submit latency through HTTP, p50 and p99.
4. Rate limit: a tenant limited to ``--rate`` jobs/s submits as fast as it can for
   ``--rate-s`` seconds: ``ratio.rate_accuracy=<accepted rate / configured rate>``
   (target 1 +- 0.1).

Latency is the farm's own: a result's finished_at minus its queued_at (one clock).
Uses ``SANDFARM_REDIS_URL`` with a queue and key prefix of its own, deleted afterwards;
one worker (``--concurrency``, default 2) and one gateway. Needs root.

    .venv/bin/python ops/bench/tenants.py [--backlog 10000] [--jobs 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from farm_throughput import cleanup, own_farm, start_worker, stop_worker

from producer.client import FarmClient
from producer.gateway_client import GatewayClient
from producer.protocol import FarmScripts, connect
from producer.protocol.scripts import utc_day
from producer.protocol.tenant_store import TenantStore
from producer.protocol.tenants import Policy
from sandbox_core import JobResult, Status

QUICK = {"command": "true"}


def latency_s(result: JobResult) -> float:
    assert result.status == Status.SUCCEEDED, result.model_dump_json()[:300]
    assert result.timings.queued_at and result.timings.finished_at
    return (result.timings.finished_at - result.timings.queued_at).total_seconds()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.env, self.settings = own_farm()
        self.redis = connect(self.settings.redis_url)
        self.store = TenantStore(self.redis, self.settings.keys)
        self.scripts = FarmScripts(self.redis, self.settings)
        self.args = args
        self.logdir = Path(tempfile.mkdtemp(prefix="sandfarm-bench-tenants-"))
        self.worker = start_worker(self.env, args.concurrency, self.logdir / "worker.log")
        self.gateway_url, self.gateway = self._start_gateway()

    def _start_gateway(self):  # type: ignore[no-untyped-def]
        import socket
        import subprocess

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        log = open(self.logdir / "gateway.log", "wb")  # noqa: SIM115 (lives with the process)
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "sandfarm"), "gateway", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    return url, proc
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the gateway did not start")
            time.sleep(0.1)

    def tenant(self, name: str, **policy: object) -> GatewayClient:
        self.store.add(name, Policy.model_validate(policy))
        token, _ = self.store.create_key(name)
        return GatewayClient(self.gateway_url, token)

    def drop(self, name: str) -> None:
        self.store.remove(name, self.scripts)

    def close(self) -> None:
        self.gateway.terminate()
        self.gateway.wait(10)
        stop_worker(self.worker)
        cleanup(self.redis, self.settings)

    # --- 1 ------------------------------------------------------------------------

    def steady(self, client: GatewayClient, tag: str, n: int, rate: float) -> list[float]:
        """Submit n jobs one by one at ``rate``/s; their latencies."""
        ids = []
        start = time.monotonic()
        for i in range(n):
            time.sleep(max(0.0, start + i / rate - time.monotonic()))
            ids.append(client.submit({**QUICK, "id": f"{tag}-{i}"}))
        return [latency_s(r) for r in client.as_completed(ids, timeout=600)]

    def fair_share(self) -> None:
        args = self.args
        a, b = self.tenant("bench-a"), self.tenant("bench-b")
        self.steady(b, "warm", 20, args.b_rate)
        idle = statistics.median(self.steady(b, "idle", args.b_jobs, args.b_rate))
        a.submit_many([{**QUICK, "id": f"a-{i}"} for i in range(args.backlog)])
        busy = statistics.median(self.steady(b, "busy", args.b_jobs, args.b_rate))
        left = self.redis.llen(self.settings.keys.pending("bench-a"))
        print(
            f"fair_share: B p50 idle {idle * 1000:.1f} ms, with A's backlog {busy * 1000:.1f} ms;"
            f" A still waiting after B: {left} of {args.backlog}"
        )
        print(f"ratio.tenant_b_p50={busy / idle:.2f}")
        self.drop("bench-a")
        self.drop("bench-b")

    # --- 2 ------------------------------------------------------------------------

    def weights(self) -> None:
        n = self.args.weight_jobs
        heavy, light = self.tenant("bench-w3", weight=3), self.tenant("bench-w1", weight=1)
        heavy.submit_many([{**QUICK, "id": f"h-{i}"} for i in range(n)])
        light.submit_many([{**QUICK, "id": f"l-{i}"} for i in range(n)])

        def done() -> tuple[int, int]:
            day = utc_day()
            pipe = self.redis.pipeline()
            pipe.hget(self.settings.keys.usage("bench-w3", day), "jobs")
            pipe.hget(self.settings.keys.usage("bench-w1", day), "jobs")
            h, lo = pipe.execute()
            return int(h or 0), int(lo or 0)

        def wait_total(total: int) -> tuple[int, int]:
            while sum(counts := done()) < total:
                time.sleep(0.05)
            return counts

        h0, l0 = wait_total(n // 5)  # past the start
        h1, l1 = wait_total(n // 5 + n)  # a window of n completions, both still saturating
        share = (h1 - h0) / ((h1 - h0) + (l1 - l0))
        print(f"weights 3:1: {h1 - h0} vs {l1 - l0} jobs in the window")
        print(f"share.tenant_a={share:.3f}")
        self.drop("bench-w3")
        self.drop("bench-w1")

    # --- 3 ------------------------------------------------------------------------

    def gateway_cost(self) -> None:
        args = self.args
        gateway = self.tenant("bench-gw")
        direct = FarmClient(settings=self.settings)
        rounds = args.rounds
        per = args.jobs // rounds
        http_s = redis_s = 0.0
        for r in range(rounds):
            for name, client in (("gateway", gateway), ("direct", direct)):
                ids = [f"{name}-{r}-{i}" for i in range(per)]
                start = time.perf_counter()
                client.submit_many([{**QUICK, "id": i} for i in ids])
                got = sum(1 for res in client.as_completed(ids, timeout=600) if res.status)
                assert got == per
                took = time.perf_counter() - start
                if name == "gateway":
                    http_s += took
                else:
                    redis_s += took
        total = per * rounds
        print(f"gateway: {total / http_s:.1f} jobs/s; direct: {total / redis_s:.1f} jobs/s")
        print(f"ratio.gateway={(total / http_s) / (total / redis_s):.3f}")
        # one job per request, as an interactive tenant submits
        times = []
        with httpx.Client(base_url=self.gateway_url, headers=gateway.http.headers) as http:
            for i in range(args.latency_n):
                start = time.perf_counter()
                reply = http.post("/v1/jobs", json={**QUICK, "id": f"lat-{i}"})
                times.append(time.perf_counter() - start)
                assert reply.status_code == 202, reply.text
        print(
            f"submit_latency_ms.p50={percentile(times, 0.5) * 1000:.2f}"
            f" submit_latency_ms.p99={percentile(times, 0.99) * 1000:.2f}"
        )
        direct.close()
        self.drop("bench-gw")

    # --- 4 ------------------------------------------------------------------------

    def rate_limit(self) -> None:
        rate, seconds = self.args.rate, self.args.rate_s
        burst = int(rate)
        client = self.tenant("bench-rate", rate=rate, burst=burst)
        accepted = 0
        stop = time.monotonic() + seconds
        lock = threading.Lock()

        def hammer(k: int) -> None:
            nonlocal accepted
            with httpx.Client(base_url=self.gateway_url, headers=client.http.headers) as http:
                i = 0
                while time.monotonic() < stop:
                    reply = http.post("/v1/jobs", json={**QUICK, "id": f"rt-{k}-{i}"})
                    i += 1
                    if reply.status_code == 202:
                        with lock:
                            accepted += 1

        start = time.monotonic()
        threads = [threading.Thread(target=hammer, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - start
        measured = (accepted - burst) / elapsed  # the bucket starts full
        print(f"rate limit {rate:g}/s: {accepted} accepted in {elapsed:.1f} s")
        print(f"ratio.rate_accuracy={measured / rate:.3f}")
        self.drop("bench-rate")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backlog", type=int, default=10_000, help="tenant A's backlog")
    parser.add_argument("--b-jobs", type=int, default=100, help="tenant B's jobs")
    parser.add_argument("--b-rate", type=float, default=10.0, help="B's jobs per second")
    parser.add_argument("--weight-jobs", type=int, default=1500, help="jobs per weighted tenant")
    parser.add_argument("--jobs", type=int, default=2000, help="jobs for the gateway cost")
    parser.add_argument("--rounds", type=int, default=4, help="gateway/direct alternations")
    parser.add_argument("--latency-n", type=int, default=300, help="single submits timed")
    parser.add_argument("--rate", type=float, default=20.0, help="the limited tenant's rate")
    parser.add_argument("--rate-s", type=float, default=10.0, help="seconds of hammering")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument(
        "--only", default="fair,weights,gateway,rate", help="which parts, comma-separated"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: the worker runs jobs in per-slot uids")
    bench = Bench(args)
    parts = {
        "fair": bench.fair_share,
        "weights": bench.weights,
        "gateway": bench.gateway_cost,
        "rate": bench.rate_limit,
    }
    print(f"# tenants bench: worker concurrency {args.concurrency}, one gateway")
    try:
        for name in args.only.split(","):
            parts[name.strip()]()
    finally:
        bench.close()


if __name__ == "__main__":
    main()
