"""Scale: a ``-n`` (default 100,000) tiny-job batch end to end through `sandfarm batch
run` on this machine, with the client's peak RSS and Redis's memory reported.

1. Enqueue: the same number of tiny jobs with FarmClient.submit_many into a farm no
   worker serves (they all wait in the client's tenant queue): jobs/s and Redis bytes
   per queued job (used_memory delta). Targets: >= 10,000 jobs/s, <= 2,000 B.
2. End to end: a JSONL of ``{"command": "true"}`` lines through `sandfarm batch run`
   against one worker (``--concurrency``, default 2): every result must come back, once;
   prints jobs/s, the client's peak RSS (target <= 300 MiB) and Redis's peak used memory
   during the run (sampled every second).

Uses ``SANDFARM_REDIS_URL`` with a queue and key prefix of its own, deleted afterwards.
Needs root (the worker's sandbox slots).

    .venv/bin/python ops/bench/scale.py [-n 100000] [--concurrency 2] [--skip-batch]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from farm_throughput import cleanup, enqueue_rate, own_farm, start_worker, stop_worker

from producer.protocol import connect, get_settings

SANDFARM = str(Path(sys.executable).parent / "sandfarm")


def peak_rss_mib(pid: int) -> float:
    """VmHWM of a live process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def batch(n: int, concurrency: int) -> None:
    env, settings = own_farm("scale")
    work = Path(tempfile.mkdtemp(prefix="sandfarm-scale-"))
    jobs, out = work / "jobs.jsonl", work / "results.jsonl"
    with jobs.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"s-{i}", "command": "true"}) + "\n")
    redis = connect(settings.redis_url)
    worker = start_worker(env, concurrency, work / "worker.log")
    peak_redis = redis.info("memory")["used_memory"]
    baseline = peak_redis
    try:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [SANDFARM, "batch", "run", str(jobs), "-o", str(out)],
            env={**os.environ, **env, "COLUMNS": "100"},
            stdout=subprocess.DEVNULL,
            stderr=open(work / "batch.err", "wb"),  # noqa: SIM115 (closed with the process)
        )
        rss = 0.0
        done = threading.Event()

        def sample() -> None:
            nonlocal rss, peak_redis
            while not done.wait(1.0):
                try:
                    rss = max(rss, peak_rss_mib(proc.pid))
                except OSError:
                    return
                peak_redis = max(peak_redis, redis.info("memory")["used_memory"])

        sampler = threading.Thread(target=sample)
        sampler.start()
        proc.wait()
        elapsed = time.perf_counter() - start
        done.set()
        sampler.join()
        if proc.returncode != 0:
            raise SystemExit((work / "batch.err").read_text()[-3000:])
        ids = [json.loads(line)["id"] for line in out.read_text().splitlines() if line.strip()]
        assert len(ids) == n == len(set(ids)), (len(ids), len(set(ids)), n)
        print(f"batch.jobs={n} batch.seconds={elapsed:.1f} batch.jobs_per_s={n / elapsed:.1f}")
        print(f"batch.client_peak_rss_mib={rss:.1f}")
        print(f"batch.redis_peak_growth_mib={(peak_redis - baseline) / 2**20:.1f}")
    finally:
        stop_worker(worker)
        cleanup(redis, settings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--skip-batch", action="store_true", help="only the enqueue part")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: the worker runs jobs in per-slot uids")
    base = get_settings()
    rate, per_job = enqueue_rate(base, args.n)
    print(f"enqueue.jobs_per_s={rate:.0f}  ({args.n} tiny jobs, submit_many)")
    print(f"redis.bytes_per_queued_job={per_job:.0f}")
    if not args.skip_batch:
        batch(args.n, args.concurrency)


if __name__ == "__main__":
    main()
