"""Sandbox start-up overhead versus bare subprocess.run, measured in the same run.

Runs each command N times through each backend and bare, interleaved so machine noise
hits both alike, and prints medians and `ratio.<backend>=<backend median / bare median>`
for `python3 -c pass` (plus `ratio.<backend>_true=` for /bin/true). Also prints how much
this process's RSS grows while a job prints 1 GiB.

    .venv/bin/python ops/bench/sandbox_overhead.py [-n 200] [--backends process,bwrap]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from breakdown import breakdown

from sandbox_core import Status, get_backend, parse_spec
from sandbox_core.defaults import SANDBOX_PATH

# The bare baseline runs the same interpreter the sandbox finds on its clean PATH.
PYTHON = shutil.which("python3", path=SANDBOX_PATH) or "python3"
CASES = {
    # name: (bare argv, job spec)
    "python": ([PYTHON, "-c", "pass"], {"code": "pass"}),
    "true": (["/bin/true"], {"command": "/bin/true"}),
}
# A command step is a bash script: what the sandbox itself runs for "true", unsandboxed,
# so the ratio against it shows the sandbox's own share (printed, not a target).
SCRIPT = Path(tempfile.mkdtemp(prefix="sandfarm-bench-")) / "step.sh"
SCRIPT.write_text("/bin/true")
BASH_BASELINE = {"true": [shutil.which("bash") or "bash", "--noprofile", "--norc", str(SCRIPT)]}


def time_bare(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, capture_output=True)
    return time.perf_counter() - start


def time_backend(backend, spec, results: list | None = None) -> float:
    start = time.perf_counter()
    result = backend.run(spec)
    elapsed = time.perf_counter() - start
    if result.status != Status.SUCCEEDED:
        raise SystemExit(f"{backend.name}: job did not succeed: {result.model_dump_json()[:500]}")
    if results is not None:
        results.append(result)
    return elapsed


def rss_growth_for_flood(backend) -> float:
    """MiB this process's peak RSS grows while a job prints 1 GiB."""
    code = (
        "import sys\nblock = b'x' * 65535 + b'\\n'\n"
        "for _ in range(16384):\n    sys.stdout.buffer.write(block)\n"
    )
    spec = parse_spec({"code": code, "limits": {"flood_kill_bytes": 2 * 1024**3, "timeout_s": 300}})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = backend.run(spec)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert result.steps[0].stdout_bytes == 1024**3, result.steps[0].stdout_bytes
    return (after - before) / 1024


def default_backends() -> str:
    """process, plus bwrap where bubblewrap can build its namespaces on this host."""
    from sandbox_core.backends.bwrap import probe

    return "process,bwrap" if probe().ok else "process"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200)
    parser.add_argument("--backends", default=default_backends())
    args = parser.parse_args()
    backends = [get_backend(name) for name in args.backends.split(",")]
    for case, (argv, raw) in CASES.items():
        spec = parse_spec(raw)
        samples: dict[str, list[float]] = {"bare": []} | {b.name: [] for b in backends}
        shell = BASH_BASELINE.get(case)
        if shell:
            samples["bash"] = []
        results: dict[str, list] = {b.name: [] for b in backends}
        for backend in backends:  # warm up: imports, slot locks, cgroup parents
            time_backend(backend, spec)
        for _ in range(args.n):
            samples["bare"].append(time_bare(argv))
            if shell:
                samples["bash"].append(time_bare(shell))
            for backend in backends:
                samples[backend.name].append(time_backend(backend, spec, results[backend.name]))
        bare = statistics.median(samples["bare"])
        for name, values in samples.items():
            ordered = sorted(values)
            p95 = ordered[int(len(ordered) * 0.95) - 1]
            print(
                f"{case:7s} {name:8s} median={statistics.median(values) * 1000:7.2f} ms"
                f"  p95={p95 * 1000:7.2f} ms"
            )
        for backend in backends:
            suffix = "" if case == "python" else f"_{case}"
            ratio = statistics.median(samples[backend.name]) / bare
            print(f"ratio.{backend.name}{suffix}={ratio:.3f}")
            print(breakdown(results[backend.name], f"{backend.name}{suffix}"))
            if shell:
                ratio = statistics.median(samples[backend.name]) / statistics.median(
                    samples["bash"]
                )
                print(f"ratio.{backend.name}{suffix}_vs_bash_script={ratio:.3f}")
    for backend in backends:
        print(f"rss_growth_mib.{backend.name}_1gib_flood={rss_growth_for_flood(backend):.1f}")


if __name__ == "__main__":
    main()
