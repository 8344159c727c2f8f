"""Farm throughput versus the same commands run bare, in the same run.

1. N jobs ``python3 -c "print(i)"`` (bash steps, as a user would submit them) through
   the farm: producer -> Redis -> one worker with concurrency 2 -> results collected,
   timed from the first submit to the last result; then the same commands run bare by
   2 threads (subprocess.run), in alternating rounds.
   Prints ``ratio.farm=<farm jobs/s / bare jobs/s>``.
   ``--code`` adds the same with python steps (``{"code": "print(i)"}``).
2. The enqueue rate of ``--enqueue`` (default 100,000) tiny jobs with submit_many into
   a farm no worker serves (they wait in the client's tenant queue), and Redis memory
   per queued job (used_memory delta).

Uses ``SANDFARM_REDIS_URL`` (default redis://127.0.0.1:6379/0) with its own queue and
key prefix, deleted afterwards. Needs root (sandbox slots).

    .venv/bin/python ops/bench/farm_throughput.py [-n 2000] [--enqueue 100000] [--code]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis
from breakdown import breakdown
from cpusplit import host, host_per_job, snapshot, this_process
from cpusplit import per_job as cpu_per_job

from producer.client import FarmClient
from producer.protocol import Settings, get_settings
from sandbox_core import JobSpec, Status
from sandbox_core.defaults import SANDBOX_PATH

PYTHON = shutil.which("python3", path=SANDBOX_PATH) or "python3"
SANDFARM = str(Path(sys.executable).parent / "sandfarm")


def bare(n: int, parallel: int) -> float:
    def one(i: int) -> None:
        out = subprocess.run(
            ["bash", "-c", f'python3 -c "print({i})"'],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            check=True,
            env={"PATH": SANDBOX_PATH},
        )
        assert out.stdout == f"{i}\n".encode()

    start = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(one, range(n)))
    return time.perf_counter() - start


def sandbox_only(n: int, parallel: int) -> float:
    """The same jobs through the process backend directly (no farm), same parallelism."""
    from sandbox_core import get_backend, parse_spec

    backend = get_backend("process")  # each run takes the first free slot

    def one(i: int) -> None:
        result = backend.run(parse_spec({"command": f'python3 -c "print({i})"'}))
        assert result.status == Status.SUCCEEDED, result.model_dump_json()[:400]

    start = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(one, range(n)))
    return time.perf_counter() - start


def through_farm(client: FarmClient, specs: list[dict], results: list | None = None) -> float:
    start = time.perf_counter()
    ids = client.submit_many(specs)
    bad = 0
    for result in client.as_completed(ids, timeout=600):
        if results is not None:
            results.append(result)
        if result.status != Status.SUCCEEDED:
            bad += 1
            if bad < 3:
                print(f"job failed: {result.model_dump_json()[:400]}", file=sys.stderr)
    elapsed = time.perf_counter() - start
    if bad:
        raise SystemExit(f"{bad} farm jobs did not succeed")
    return elapsed


def redis_calls(client: redis.Redis) -> int:
    """Commands Redis has run so far (all clients)."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


def start_worker(env: dict[str, str], concurrency: int, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [SANDFARM, "worker", "-c", str(concurrency), "-n", f"bench-{uuid.uuid4().hex[:6]}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while " ready." not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"worker did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    return proc


def stop_worker(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def cleanup(client: redis.Redis, settings: Settings) -> None:
    client.delete(settings.queue)
    # kombu's routing-table keys for the queue (TTL-less).
    for key in client.scan_iter(f"_kombu.binding*{settings.queue}", count=5000):
        client.unlink(key)
    for key in client.scan_iter(f"{settings.key_prefix}*", count=5000):
        client.unlink(key)


def enqueue_rate(settings: Settings, n: int) -> tuple[float, float]:
    """(jobs/s, bytes of Redis memory per queued job) for n tiny jobs, no consumer."""
    tiny = get_settings(
        redis_url=settings.redis_url,
        queue=f"bench-enqueue-{uuid.uuid4().hex[:6]}",
        key_prefix=f"bench-{uuid.uuid4().hex[:6]}:",
    )
    with FarmClient(settings=tiny) as client:
        client.submit({"command": "true"})  # connections, queue declaration
        specs = [JobSpec(command=f"echo {i}") for i in range(n)]
        client.redis.delete(tiny.queue)
        before = client.redis.info("memory")["used_memory"]
        start = time.perf_counter()
        client.submit_many(specs)
        elapsed = time.perf_counter() - start
        # no worker online: every job waits in the tenant's queue (with the warm one)
        queued = client.redis.llen(tiny.keys.pending(client.tenant)) - 1
        after = client.redis.info("memory")["used_memory"]
        assert queued == n, (queued, n)
        cleanup(client.redis, tiny)
    return n / elapsed, (after - before) / n


def own_farm(name: str = "bench", **extra_env: str) -> tuple[dict[str, str], Settings]:
    """A queue and key prefix of this run's own on the configured Redis: the worker's
    environment and the same settings for this process's clients."""
    tag = uuid.uuid4().hex[:6]
    base = get_settings()
    env = {
        "SANDFARM_REDIS_URL": base.redis_url,
        "SANDFARM_QUEUE": f"{name}-{tag}",
        "SANDFARM_KEY_PREFIX": f"{name}-{tag}:",
        **extra_env,
    }
    settings = get_settings(
        redis_url=base.redis_url, queue=env["SANDFARM_QUEUE"], key_prefix=env["SANDFARM_KEY_PREFIX"]
    )
    return env, settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=2000, help="jobs per throughput run")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--enqueue", type=int, default=100_000, help="jobs for the enqueue rate")
    parser.add_argument("--code", action="store_true", help="also python-step jobs")
    parser.add_argument("--rounds", type=int, default=4, help="farm/bare alternations")
    parser.add_argument("--prefetch", type=int, default=None, help="worker prefetch multiplier")
    parser.add_argument(
        "--sandbox", action="store_true", help="also the process backend alone (no farm)"
    )
    parser.add_argument("--no-events", action="store_true", help="worker without task events")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: the worker runs jobs in per-slot uids")

    extra = {"SANDFARM_PREFETCH_MULTIPLIER": str(args.prefetch)} if args.prefetch else {}
    if args.no_events:
        extra["SANDFARM_TASK_EVENTS"] = "0"
    env, settings = own_farm(**extra)
    n, par = args.n, args.concurrency
    print(
        f"# {n} jobs, concurrency {par}, prefetch x{args.prefetch or 1},"
        f" events {'off' if args.no_events else 'on'}, redis {settings.redis_url}"
    )
    logdir = Path(tempfile.mkdtemp(prefix="sandfarm-bench-"))
    worker = start_worker(env, par, logdir / "worker.log")
    client = FarmClient(settings=settings)
    try:
        command = [{"command": f'python3 -c "print({i})"'} for i in range(n)]
        through_farm(client, command[: min(50, n)])  # warm: pool processes, slots, cgroups
        bare(min(50, n), par)
        # Interleaved rounds, so load from elsewhere on the machine hits both alike.
        farm_s = bare_s = sandbox_s = 0.0
        results: list = []
        per_round = -(-n // args.rounds)
        for start in range(0, n, per_round):
            part = command[start : start + per_round]
            farm_s += through_farm(client, part, results)
            bare_s += bare(len(part), par)
            if args.sandbox:
                sandbox_s += sandbox_only(len(part), par)
        calls = redis_calls(client.redis)
        redis_pid = int(client.redis.info("server")["process_id"])
        cpu_before, host_before = snapshot(worker.pid, redis_pid), host()
        through_farm(client, command[: min(500, n)])
        cpu_split = cpu_per_job(cpu_before, snapshot(worker.pid, redis_pid), min(500, n))
        host_split = host_per_job(host_before, host(), min(500, n))
        per_job = (redis_calls(client.redis) - calls) / min(500, n)
        bare_before, host_before = this_process(), host()
        bare(min(500, n), par)
        bare_cpu = cpu_per_job(bare_before, this_process(), min(500, n))
        bare_host = host_per_job(host_before, host(), min(500, n))
        farm_rate, bare_rate = n / farm_s, n / bare_s
        print(f"farm.jobs_per_s={farm_rate:.1f}  ({farm_s:.2f} s for {n})")
        print(f"bare.jobs_per_s={bare_rate:.1f}  ({bare_s:.2f} s for {n})")
        if args.sandbox:
            sandbox_rate = n / sandbox_s
            print(f"sandbox.jobs_per_s={sandbox_rate:.1f}  (process backend, no farm)")
            print(f"ratio.sandbox={sandbox_rate / bare_rate:.3f}")
            print(f"ratio.farm_vs_sandbox={farm_rate / sandbox_rate:.3f}")
        print(f"ratio.farm={farm_rate / bare_rate:.3f}")
        print(breakdown(results, "farm"))
        print(f"redis.commands_per_job={per_job:.1f}  (client, worker, events; INFO commandstats)")
        print(f"farm.{cpu_split}")
        print(f"bare.{bare_cpu}  (jobs: the children the bench reaped)")
        print(f"farm.{host_split}")
        print(f"bare.{bare_host}  (the whole host: /proc/stat)")
        if args.code:
            code = [{"code": f"print({i})"} for i in range(n)]
            code_s = through_farm(client, code)
            print(f"farm_code.jobs_per_s={n / code_s:.1f}")
            print(f"ratio.farm_code={(n / code_s) / bare_rate:.3f}")
    finally:
        stop_worker(worker)
        cleanup(client.redis, settings)
        client.close()
        shutil.rmtree(logdir, ignore_errors=True)
    if args.enqueue:
        rate, per_job = enqueue_rate(settings, args.enqueue)
        print(f"enqueue.jobs_per_s={rate:.0f}  ({args.enqueue} tiny jobs, submit_many)")
        print(f"redis.bytes_per_queued_job={per_job:.0f}")


if __name__ == "__main__":
    main()
