"""`sandfarm batch run` end to end: real Redis (its own DB), a real worker subprocess.

Every good job appends a line to a marker file outside its sandbox, so "executed
exactly once" is checked on the host, not inferred from the results.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import job_shared_dir, require

BIN = Path(sys.executable).parent


def sandfarm(
    *args: str, url: str, timeout: float = 60, api: tuple[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the CLI on the farm at ``url``; with ``api`` (gateway URL, key), `batch run`
    goes through the tenants' gateway instead of Redis."""
    env = {**os.environ, "SANDFARM_REDIS_URL": url, "COLUMNS": "200"}
    if api is not None:
        env = {**os.environ, "SANDFARM_API_KEY": api[1], "COLUMNS": "200"}
        env.pop("SANDFARM_REDIS_URL", None)  # a tenant has no Redis
        args = (*args, "--api", api[0])
    return subprocess.run(
        [str(BIN / "sandfarm"), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def farm(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis DB of this module's own (locked, flushed) and a worker consuming it."""
    from tests.farmkit import private_db

    require(os.geteuid() == 0, "the process backend's slot uids need root")
    require((BIN / "sandfarm").exists(), "the sandfarm entry point is not installed")
    with private_db(redis_url) as url:
        yield from _worker(url, tmp_path_factory)


def _worker(url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from producer.client import FarmClient

    name = f"batchtest-{os.getpid()}"
    log = tmp_path_factory.mktemp("batch-worker") / "worker.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [str(BIN / "sandfarm"), "worker", "--backend", "process", "--concurrency", "2",
             "--name", name, "--redis-url", url],
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        with FarmClient(url) as client:
            deadline = time.monotonic() + 45
            while not any(w["name"].startswith(f"{name}@") for w in client.status()["workers"]):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"worker did not come online:\n{log.read_text()}")
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()  # Celery's warm shutdown; then nothing of its group may remain
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture
def marks() -> Iterator[Path]:
    """A directory the sandbox uids can append to (pytest's tmp_path is root-only)."""
    path = job_shared_dir("sandfarm-batch-marks-")
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def marked(marks: Path) -> dict[str, int]:
    return {p.name: len(p.read_text().splitlines()) for p in marks.iterdir()}


def write_jobs(path: Path, lines: list[object]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def mixed_jobs(marks: Path) -> list[object]:
    m = str(marks)
    return [
        {"command": f"echo run >> {m}/ok; echo hello", "labels": {"expect": "succeeded"}},
        '{"command": "echo never", ',  # 2: not JSON
        {"command": f"echo run >> {m}/nope", "timeout": 5},  # 3: unknown top-level field
        {"command": f"echo run >> {m}/nope", "limits": {"wall_s": 3}},  # 4: unknown nested
        {"command": f"echo run >> {m}/nope", "limits": {"memory_mb": 10**6}},  # 5: over limit
        "",  # blank: skipped, not an error
        {
            "code": f"open('{m}/fails', 'a').write('run\\n'); raise SystemExit(3)",
            "labels": {"expect": "failed"},
        },
        ["not", "an", "object"],  # 8
        {
            "steps": [
                {"kind": "write_file", "path": "t.py", "content": "print(6 * 7)\n"},
                {"kind": "bash", "command": f"echo run >> {m}/steps; python3 t.py"},
            ],
            "labels": {"expect": "succeeded"},
        },
        {
            "command": f"echo run >> {m}/slow; sleep 30",
            "limits": {"timeout_s": 1},
            "labels": {"expect": "timed_out"},
        },
        {"id": f"explicit-{uuid.uuid4().hex[:8]}", "command": f"echo run >> {m}/explicit"},
        {"command": "true", "limits": {"timeout_s": 7200}},  # 12: over the farm maximum
    ]


def test_bad_lines_reported_good_lines_run_exactly_once(farm: str, marks: Path, tmp_path) -> None:
    jobs = write_jobs(tmp_path / "jobs.jsonl", mixed_jobs(marks))
    out = tmp_path / "results.jsonl"
    proc = sandfarm("batch", "run", str(jobs), "-o", str(out), "--chunk", "2", url=farm)
    assert proc.returncode == 0, proc.stderr

    lines = read(out)
    errors = {r["line"]: r["error"] for r in lines if "error" in r}
    assert sorted(errors) == [2, 3, 4, 5, 8, 12]
    assert errors[2].startswith("json: not valid JSON")
    assert errors[3] == "timeout: unknown field; did you mean 'limits.timeout_s'?"
    assert errors[4].startswith("limits.wall_s: unknown field")
    assert errors[5].startswith("limits.memory_mb: Input should be less than or equal to")
    assert errors[8] == "job: a job is a JSON object, got list"
    assert errors[12].startswith("limits.timeout_s: Input should be less than or equal to 3600")
    for number in errors:
        assert f"jobs.jsonl:{number}:" in proc.stderr

    results = [r for r in lines if "status" in r]
    assert len(results) == 5 == len({r["id"] for r in results})
    by_expect = {r["labels"].get("expect"): r for r in results if r["labels"]}
    assert by_expect["succeeded"]["status"] == "succeeded"
    assert by_expect["failed"]["status"] == "failed"
    assert by_expect["timed_out"]["status"] == "timed_out"
    assert all(r["attempts"] == 1 and r["worker"].startswith("batchtest-") for r in results)
    steps = next(r for r in results if len(r["steps"]) == 2)
    assert steps["steps"][1]["stdout"] == "42\n"
    assert marked(marks) == {"ok": 1, "fails": 1, "steps": 1, "slow": 1, "explicit": 1}
    assert "expected status: 4/4 as labelled" in proc.stdout


@pytest.fixture(params=["redis", "api"])
def through(request, farm: str, tmp_path_factory) -> Iterator[tuple[str, str] | None]:
    """How the batch reaches the farm: Redis (None) or a real gateway (its URL, a key)."""
    if request.param == "redis":
        yield None
        return
    from producer.protocol import get_settings
    from tests.farmkit import Farm
    from tests.gatewaykit import TenantFarm

    settings = get_settings(redis_url=farm)  # the module worker's queue and prefix
    tf = TenantFarm(
        Farm(
            farm,
            tmp_path_factory.mktemp("gw"),
            {"SANDFARM_QUEUE": settings.queue, "SANDFARM_KEY_PREFIX": settings.key_prefix},
        )
    )
    try:
        gateway = tf.start_gateway()
        yield gateway.url, tf.tenant(f"batch-{uuid.uuid4().hex[:6]}")
    finally:
        tf.stop()


def test_resume_skips_done_ids_and_never_reruns(farm: str, marks: Path, tmp_path, through) -> None:
    jobs = write_jobs(tmp_path / "jobs.jsonl", mixed_jobs(marks))
    out = tmp_path / "results.jsonl"
    first_run = sandfarm("batch", "run", str(jobs), "-o", str(out), url=farm, api=through)
    assert first_run.returncode == 0, first_run.stderr
    first = out.read_text()

    # Everything already answered: nothing is submitted, RESULTS is unchanged.
    again = sandfarm("batch", "run", str(jobs), "-o", str(out), url=farm, api=through)
    assert again.returncode == 0, again.stderr
    assert "resuming: 5 jobs already in" in again.stderr
    assert out.read_text() == first

    # A crash lost one received result and tore the last line: the rerun fetches the
    # stored result (the farm's idempotent ids) instead of running the job again.
    kept = [line for line in first.splitlines() if len(json.loads(line).get("steps", ())) != 2]
    assert len(kept) == len(first.splitlines()) - 1
    out.write_text("\n".join(kept) + '\n{"id": "torn-by-a-cra')
    # A line appended to the input since: it runs, once.
    with jobs.open("a") as fh:
        fh.write(json.dumps({"command": f"echo run >> {marks}/added"}) + "\n")
    third = sandfarm("batch", "run", str(jobs), "-o", str(out), url=farm, api=through)
    assert third.returncode == 0, third.stderr
    assert "resuming: 4 jobs already in" in third.stderr
    results = [r for r in read_tolerant(out) if "status" in r]
    assert len(results) == 6 == len({r["id"] for r in results})
    assert sum("error" in r for r in read_tolerant(out)) == 6  # error lines not repeated
    assert marked(marks) == {
        "ok": 1, "fails": 1, "steps": 1, "slow": 1, "explicit": 1, "added": 1,
    }  # fmt: skip


def read_tolerant(path: Path) -> list[dict]:
    from producer.batch import read_results

    return list(read_results(path))


def test_wait_timeout_exits_1_and_rerun_completes(farm: str, marks: Path, tmp_path) -> None:
    jobs = write_jobs(
        tmp_path / "slow.jsonl",
        [{"command": f"echo run >> {marks}/slow; sleep 2", "limits": {"timeout_s": 20}}],
    )
    out = tmp_path / "results.jsonl"
    cut = sandfarm("batch", "run", str(jobs), "-o", str(out), "--wait-timeout", "0.5", url=farm)
    assert cut.returncode == 1, cut.stderr
    assert "1 jobs have no result yet; rerun to resume" in cut.stderr
    done = sandfarm("batch", "run", str(jobs), "-o", str(out), "--wait-timeout", "30", url=farm)
    assert done.returncode == 0, done.stderr
    assert [r["status"] for r in read(out)] == ["succeeded"]
    assert marked(marks) == {"slow": 1}
