"""End-to-end latency of a `python3 -c "print(1)"` job on containers, in the same run:

(a) the docker backend with a fresh container per job,
(b) the docker backend with a warm pool (each container used by one job, then destroyed),
(c) llm-sandbox's Docker backend on the same image, when it installs here (own venv),
and, for reference, a bare `docker run --rm`.

Prints p50/p95 per variant, how many warm jobs' first step ran through the launcher armed
in their container (`warm.armed=`), and `ratio.docker_warm=<warm p50 / fresh p50>`
(target <= 0.35).

    .venv/bin/python ops/bench/docker_latency.py [-n 30] [--llm-sandbox-n 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from sandbox_core import Status, get_backend, parse_spec
from sandbox_core.defaults import DOCKER_IMAGE as DEFAULT_IMAGE

JOB = {"command": "python3 -c 'print(1)'"}
LLM_VENV = Path(__file__).resolve().parents[2] / ".venv-llm-sandbox"
LLM_SCRIPT = f"""
import json, sys, time
from llm_sandbox import SandboxSession
out = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    with SandboxSession(lang="python", image={DEFAULT_IMAGE!r}, keep_template=True,
                        skip_environment_setup=True) as session:
        result = session.run("print(1)")
    assert result.stdout.strip() == "1", result
    out.append(time.perf_counter() - t)
print(json.dumps(out))
"""


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[max(0, int(len(ordered) * 0.95) - 1)]
    return (
        f"p50={statistics.median(values) * 1000:7.1f} ms  p95={p95 * 1000:7.1f} ms  n={len(values)}"
    )


def time_job(backend, armed: list[bool] | None = None) -> float:
    spec = parse_spec(JOB)
    start = time.perf_counter()
    result = backend.run(spec)
    elapsed = time.perf_counter() - start
    if result.status != Status.SUCCEEDED or result.steps[0].stdout != "1\n":
        raise SystemExit(f"job failed: {result.model_dump_json()[:400]}")
    if armed is not None:
        armed.append(bool(result.timings.phases.prewarmed))
    return elapsed


def docker_run_cli() -> float:
    start = time.perf_counter()
    subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            "--read-only",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--user",
            "1000:1000",
            DEFAULT_IMAGE,
            "python3",
            "-c",
            "print(1)",
        ],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start


def llm_sandbox(n: int) -> list[float] | str:
    if not (LLM_VENV / "bin" / "python").exists():
        made = subprocess.run([sys.executable, "-m", "venv", str(LLM_VENV)], capture_output=True)
        pip = subprocess.run(
            [str(LLM_VENV / "bin" / "pip"), "install", "-q", "llm-sandbox[docker]"],
            capture_output=True,
            text=True,
        )
        if made.returncode or pip.returncode:
            return f"llm-sandbox did not install: {pip.stderr.strip()[-200:]}"
    run = subprocess.run(
        [str(LLM_VENV / "bin" / "python"), "-c", LLM_SCRIPT, str(n)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if run.returncode:
        return f"llm-sandbox failed: {run.stderr.strip()[-300:]}"
    return json.loads(run.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=30)
    parser.add_argument("--llm-sandbox-n", type=int, default=5)
    args = parser.parse_args()

    fresh = get_backend("docker")
    warm = get_backend("docker", warm_pool=2)
    warm.start_pool(wait_s=60)
    samples: dict[str, list[float]] = {"fresh": [], "warm": [], "docker run": []}
    armed: list[bool] = []
    time_job(fresh)  # warm the engine's caches for both
    for _ in range(args.n):  # interleaved, so machine noise hits every variant alike
        samples["fresh"].append(time_job(fresh))
        warm.start_pool(wait_s=60)  # jobs arriving slower than the refill: pool is full
        samples["warm"].append(time_job(warm, armed))
        samples["docker run"].append(docker_run_cli())
    fresh.close()
    warm.close()
    for name, values in samples.items():
        print(f"{name:12s} {percentiles(values)}")
    print(f"warm.armed={sum(armed)}/{len(armed)}")
    llm = llm_sandbox(args.llm_sandbox_n) if args.llm_sandbox_n > 0 else "not run (-n 0)"
    if isinstance(llm, str):
        print(f"llm-sandbox  {llm}")
    else:
        print(f"{'llm-sandbox':12s} {percentiles(llm)}")
        print(
            f"ratio.docker_warm_vs_llm_sandbox="
            f"{statistics.median(samples['warm']) / statistics.median(llm):.3f}"
        )
    ratio = statistics.median(samples["warm"]) / statistics.median(samples["fresh"])
    print(f"ratio.docker_warm={ratio:.3f}")


if __name__ == "__main__":
    main()
