"""`sandfarm batch run` as a new user meets it: real Redis, a real worker, the CLI as a
subprocess. Reused ids, waits with no worker, batch defaults, stdin, `-o -`, --strict,
Ctrl-C, and a summary whose jobs/s counts only what this invocation ran. Last, the CLI's
usage errors and edge cases on a fake farm (tests.unit.test_batch_unit.FakeClient).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from producer import batch as b
from producer.batch import job_ids_of
from producer.cli import main
from producer.client import FarmClient
from tests.farmkit import Farm, wait_for
from tests.integration import test_batch
from tests.integration.test_batch import BIN, marked, read, write_jobs
from tests.unit.test_batch_unit import FakeClient, jsonl, mixed, results

SANDFARM = str(BIN / "sandfarm")
farm = test_batch.farm  # fixtures: a private Redis DB with a worker; a dir jobs append to
marks = test_batch.marks


def env_for(url: str) -> dict[str, str]:
    return {**os.environ, "SANDFARM_REDIS_URL": url, "COLUMNS": "200"}


def cli(*args: object, url: str, **kw) -> subprocess.CompletedProcess[str]:
    run = [SANDFARM, *map(str, args)]
    return subprocess.run(run, env=env_for(url), capture_output=True, text=True, timeout=90, **kw)


def errors_of(path: Path) -> dict[int, str]:
    return {r["line"]: r["error"] for r in read(path) if "error" in r}


def results_of(path: Path) -> dict[str, dict]:
    return {r["id"]: r for r in read(path) if "status" in r}


# ---------------------------------------------------------------- reused ids


def test_edited_line_under_its_own_id_is_a_conflict_never_the_old_verdict(
    farm: str, marks: Path, tmp_path: Path
) -> None:
    pin = f"pin-{uuid.uuid4().hex[:8]}"
    lines: list[object] = [
        {"id": pin, "command": f"echo v1 >> {marks}/pin"},
        {"command": f"echo run >> {marks}/other"},
    ]
    jobs = write_jobs(tmp_path / "jobs.jsonl", lines)
    first = tmp_path / "first.jsonl"
    assert cli("batch", "run", jobs, "-o", first, url=farm).returncode == 0

    lines[0] = {"id": pin, "command": f"echo v2 >> {marks}/pin"}  # edited, same id
    lines.append({"command": f"echo run >> {marks}/added"})
    write_jobs(jobs, lines)
    refused = f"id: '{pin}' already names a different job"

    # Another RESULTS: the farm itself refuses the id; the other lines still run.
    fresh = tmp_path / "fresh.jsonl"
    proc = cli("batch", "run", jobs, "-o", fresh, url=farm)
    assert proc.returncode == 0, proc.stderr
    assert f"jobs.jsonl:1: {refused}" in proc.stderr
    assert errors_of(fresh)[1].startswith(refused)
    assert pin not in results_of(fresh)
    assert sorted(r["status"] for r in results_of(fresh).values()) == ["succeeded"] * 2
    assert "1 invalid input lines" in proc.stdout

    # The same RESULTS, which holds v1's verdict: not resumed as if it were v2's.
    again = cli("batch", "run", jobs, "-o", first, url=farm)
    assert again.returncode == 0, again.stderr
    assert f"jobs.jsonl:1: {refused}" in again.stderr
    assert "resuming: 1 jobs already in" in again.stderr  # `other`; `added` is new
    strict = cli("batch", "run", jobs, "-o", first, "--strict", url=farm)
    assert strict.returncode == 2, strict.stderr
    assert "--strict: 1 invalid input lines" in strict.stderr
    assert (marks / "pin").read_text() == "v1\n"  # v2 never ran under the old id
    assert marked(marks) == {"pin": 1, "other": 1, "added": 1}


def test_id_prefix_namespaces_every_id(farm: str, marks: Path, tmp_path: Path) -> None:
    p1, p2 = f"p1-{uuid.uuid4().hex[:6]}", f"p2-{uuid.uuid4().hex[:6]}"
    lines: list[object] = [
        {"id": "mine", "command": f"echo v1 >> {marks}/mine"},
        {"command": f"echo run >> {marks}/derived"},
        {"id": "x" * 120, "command": "true"},  # fits alone, not with the prefix
    ]
    jobs = write_jobs(tmp_path / "jobs.jsonl", lines)
    out1 = tmp_path / "r1.jsonl"
    proc = cli("batch", "run", jobs, "-o", out1, "--id-prefix", p1, url=farm)
    assert proc.returncode == 0, proc.stderr
    ids = set(results_of(out1))
    assert f"{p1}:mine" in ids and all(i.startswith(f"{p1}:") for i in ids) and len(ids) == 2
    assert errors_of(out1)[3].startswith(f"id: '{'x' * 120}' is too long with --id-prefix")
    assert "jobs.jsonl:3: id:" in proc.stderr

    lines[0] = {"id": "mine", "command": f"echo v2 >> {marks}/mine"}
    write_jobs(jobs, lines)
    same = cli("batch", "run", jobs, "-o", tmp_path / "r2.jsonl", "--id-prefix", p1, url=farm)
    assert f"jobs.jsonl:1: id: '{p1}:mine' already names a different job" in same.stderr
    out3 = tmp_path / "r3.jsonl"
    new = cli("batch", "run", jobs, "-o", out3, "--id-prefix", p2, url=farm)
    assert new.returncode == 0, new.stderr
    assert results_of(out3)[f"{p2}:mine"]["status"] == "succeeded"
    assert (marks / "mine").read_text() == "v1\nv2\n"  # the edit ran, under the new prefix
    assert marked(marks)["derived"] == 2


# ---------------------------------------------------------------- no silent waits


def test_no_worker_on_the_queue_is_said_within_10s(farm: str, tmp_path: Path) -> None:
    lonely = Farm(farm, tmp_path)  # its own queue and key prefix: nobody consumes it
    jobs = write_jobs(tmp_path / "jobs.jsonl", [{"command": "true"}])
    proc = subprocess.Popen(
        [SANDFARM, "batch", "run", str(jobs), "-o", str(tmp_path / "r.jsonl")],
        env={**env_for(farm), **lonely.env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr], daemon=True).start()
    want = f"no worker consumes queue {lonely.settings.queue} at {farm}; still waiting"
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 20  # start-up, NOTICE_AFTER_S (5 s), a tick; under load
        while not any(want in line for line in seen):
            left = deadline - time.monotonic()
            assert left > 0, f"no notice within 20 s: {seen}"
            try:
                seen.append(lines.get(timeout=left))
            except queue.Empty:
                continue
        assert proc.poll() is None  # still waiting, as it said
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
    assert proc.returncode == 130


# ---------------------------------------------------------------- flags


def test_batch_defaults_apply_where_a_line_sets_none(farm: str, tmp_path: Path) -> None:
    hog = "b = bytearray(200 * 2**20); print(len(b))"
    lines = [
        {"command": "sleep 3", "labels": {"expect": "timed_out"}},
        {"command": "sleep 3", "limits": {"timeout_s": 20}, "labels": {"expect": "succeeded"}},
        {"code": hog, "labels": {"expect": "memory_exceeded"}},
        {"code": hog, "limits": {"memory_mb": 512}, "labels": {"expect": "succeeded"}},
        {"command": "true", "labels": {"expect": "succeeded", "want": "bwrap"}},
        {"command": "true", "backend": "process", "labels": {"expect": "succeeded",
                                                             "want": "process"}},
    ]  # fmt: skip
    jobs = write_jobs(tmp_path / "jobs.jsonl", lines)
    out = tmp_path / "r.jsonl"
    flags = ["--timeout", "1", "--memory-mb", "64", "--backend", "bwrap", "--wait-timeout", "60"]
    proc = cli("batch", "run", jobs, "-o", out, *flags, url=farm)
    assert proc.returncode == 0, proc.stderr
    assert "expected status: 6/6 as labelled" in proc.stdout, proc.stdout
    for result in results_of(out).values():
        if "want" in result["labels"]:
            assert result["backend"] == result["labels"]["want"]
    assert len(results_of(out)) == 6


def test_stdin_is_read_once(farm: str, marks: Path, tmp_path: Path) -> None:
    jobs = write_jobs(
        tmp_path / "jobs.jsonl",
        [{"command": f"echo run >> {marks}/a"}, "{bad", {"command": f"echo run >> {marks}/b"}],
    )
    out = tmp_path / "r.jsonl"
    proc = subprocess.run(
        f"cat {jobs} | {SANDFARM} batch run - -o {out}",
        shell=True,
        env=env_for(farm),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr
    assert "stdin:2: json: not valid JSON" in proc.stderr
    assert [(r["file"], r["line"]) for r in read(out) if "error" in r] == [("stdin", 2)]
    assert all(job_id.startswith("stdin:") for job_id in results_of(out))
    assert "2 results: 2 new in" in proc.stdout
    assert marked(marks) == {"a": 1, "b": 1}


def test_output_dash_is_stdout(farm: str, marks: Path, tmp_path: Path) -> None:
    jobs = write_jobs(tmp_path / "jobs.jsonl", [{"command": f"echo run >> {marks}/a"}, "[1]"])
    proc = cli("batch", "run", jobs, "-o", "-", url=farm, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]  # nothing but JSONL
    assert [r.get("status") for r in records if "status" in r] == ["succeeded"]
    assert [r["line"] for r in records if "error" in r] == [2]
    assert "sandfarm batch" in proc.stderr and "1 results" in proc.stderr
    assert not (tmp_path / "-").exists()


def test_strict_exits_2_and_still_writes_the_valid_results(farm: str, tmp_path: Path) -> None:
    jobs = write_jobs(tmp_path / "jobs.jsonl", [{"command": "true"}, {"command": "true", "x": 1}])
    out = tmp_path / "r.jsonl"
    proc = cli("batch", "run", jobs, "-o", out, "--strict", url=farm)
    assert proc.returncode == 2, proc.stderr
    assert "--strict: 1 invalid input lines" in proc.stderr
    assert [r["status"] for r in results_of(out).values()] == ["succeeded"]
    assert cli("batch", "run", jobs, "-o", out, url=farm).returncode == 0  # without: 0


# ---------------------------------------------------------------- Ctrl-C


def _interrupted_run(farm: str, tmp_path: Path, *flags: str) -> tuple[int, str, list[str]]:
    """A batch of 3 slow jobs, Ctrl-C once all are submitted: (exit code, stderr, ids)."""
    prefix = f"int-{uuid.uuid4().hex[:6]}"
    lines: list[object] = [{"command": f"sleep 5; echo {i}"} for i in range(3)]
    jobs = write_jobs(tmp_path / "slow.jsonl", lines)
    ids = job_ids_of(jobs, prefix)
    out = tmp_path / "r.jsonl"
    args = ["batch", "run", str(jobs), "-o", str(out), "--id-prefix", prefix, *flags]
    proc = subprocess.Popen(
        [SANDFARM, *args], env=env_for(farm), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    with FarmClient(farm) as client:
        wait_for(lambda: all(client.state(i) != "unknown" for i in ids), 30, 0.1, "submission")
        time.sleep(2)  # the CLI is waiting for results now (the jobs run 5 s)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    return proc.returncode, err.decode(), ids


def test_ctrl_c_says_what_still_runs(farm: str, tmp_path: Path) -> None:
    code, err, ids = _interrupted_run(farm, tmp_path)
    assert code == 130, err
    assert "Traceback" not in err
    assert "interrupted: 3 submitted jobs have no result yet and keep running on the farm" in err
    assert f"results so far are in {tmp_path / 'r.jsonl'}; rerun to resume" in err
    with FarmClient(farm) as client:
        assert all(client.state(i) in ("queued", "running") for i in ids)  # not cancelled
        for job_id in ids:  # leave the worker free for the next tests
            client.cancel(job_id)


def test_ctrl_c_with_cancel_on_interrupt_cancels_them(farm: str, tmp_path: Path) -> None:
    code, err, ids = _interrupted_run(farm, tmp_path, "--cancel-on-interrupt")
    assert code == 130, err
    assert "Traceback" not in err
    assert "cancelled 3 jobs (0 had already ended)" in err, err
    with FarmClient(farm) as client:
        for job_id in ids:
            result = client.result(job_id, timeout=30)
            assert result is not None and result.status.value == "cancelled", job_id


# ---------------------------------------------------------------- summary


def test_jobs_per_second_counts_only_this_invocation(
    farm: str, marks: Path, tmp_path: Path
) -> None:
    lines: list[object] = [{"command": f"echo run >> {marks}/{n}"} for n in ("a", "b")]
    jobs = write_jobs(tmp_path / "jobs.jsonl", lines)
    first = cli("batch", "run", jobs, "-o", tmp_path / "r1.jsonl", url=farm)
    assert "2 results: 2 new in" in first.stdout, first.stdout
    lines.append({"command": f"echo run >> {marks}/c"})
    write_jobs(jobs, lines)
    # A fresh RESULTS: a and b come back stored from the first run, only c runs.
    second = cli("batch", "run", jobs, "-o", tmp_path / "r2.jsonl", url=farm)
    assert second.returncode == 0, second.stderr
    assert "3 results: 1 new in" in second.stdout, second.stdout
    assert "2 already done before this run" in second.stdout
    assert marked(marks) == {"a": 1, "b": 1, "c": 1}


# ---------------------------------------------------------------- the CLI on a fake farm (no Redis)


@pytest.fixture
def fake_farm(monkeypatch: pytest.MonkeyPatch) -> list[FakeClient]:
    made: list[FakeClient] = []

    def factory(redis_url: str | None = None, settings: object = None) -> FakeClient:
        made.append(FakeClient())
        return made[-1]

    fake_module(monkeypatch, factory)
    return made


def fake_module(monkeypatch: pytest.MonkeyPatch, factory) -> None:
    """producer.client replaced by ``factory``; no Redis is asked whether it answers."""
    module = types.ModuleType("producer.client")
    module.FarmClient = factory  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "producer.client", module)
    monkeypatch.setattr("producer.commands.common.reachable_settings", lambda **kw: None)


def test_cli_run_exit_0_whatever_the_statuses(tmp_path: Path, fake_farm) -> None:
    jobs = mixed(tmp_path)
    out = tmp_path / "r.jsonl"
    res = CliRunner().invoke(main, ["batch", "run", str(jobs), "-o", str(out), "--chunk", "2"])
    assert res.exit_code == 0, res.output
    assert "timed_out" in res.stdout and "invalid" in res.stdout
    assert "jobs.jsonl:2:" in res.stderr
    assert len(results(out)) == 7


@pytest.mark.parametrize(
    "args",
    [
        ["batch", "run", "{jobs}"],  # no -o
        ["batch", "run", "{tmp}/missing.jsonl", "-o", "{tmp}/r.jsonl"],
        ["batch", "run", "{jobs}", "-o", "{jobs}"],
        ["batch", "run", "{jobs}", "{jobs}", "-o", "{tmp}/r.jsonl"],
        ["batch", "run", "{jobs}", "-o", "{tmp}/r.jsonl", "--chunk", "0"],
        ["batch", "run", "-o", "{tmp}/r.jsonl"],
        ["batch", "run", "-", "-", "-o", "{tmp}/r.jsonl"],
        ["batch", "run", "{jobs}", "-o", "{tmp}/r.jsonl", "--id-prefix", "run 7"],
        ["batch", "run", "{jobs}", "-o", "{tmp}/r.jsonl", "--id-prefix", "x" * 33],
        ["batch", "run", "{jobs}", "-o", "{tmp}/r.jsonl", "--timeout", "-1"],
        ["batch", "run", "{jobs}", "-o", "{tmp}/r.jsonl", "--timeout", "7200"],
        ["batch", "run", "{jobs}", "-o", "{tmp}/r.jsonl", "--memory-mb", "1000000"],
        ["batch", "run", "{jobs}", "-o", "{tmp}/r.jsonl", "--backend", "vm"],
        ["batch", "run", "{jobs}", "-o", "{tmp}/r.jsonl", "--wait-timeout", "0"],
    ],
)
def test_cli_bad_usage_exits_2(tmp_path: Path, fake_farm, args: list[str]) -> None:
    jobs = mixed(tmp_path)
    argv = [a.format(jobs=jobs, tmp=tmp_path) for a in args]
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert not fake_farm or not fake_farm[0].submitted


def test_cli_farm_failure_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(redis_url: str | None = None, settings: object = None):
        raise ConnectionError("Redis at redis://nowhere refused")

    fake_module(monkeypatch, broken)
    res = CliRunner().invoke(
        main, ["batch", "run", str(mixed(tmp_path)), "-o", str(tmp_path / "r")]
    )
    assert res.exit_code == 1
    assert "refused" in res.stderr


def test_cli_stdin_is_spooled_once_and_named_stdin(tmp_path: Path, fake_farm) -> None:
    out = tmp_path / "r.jsonl"
    text = '{"code": "1"}\nnope\n{"code": "2"}\n'
    res = CliRunner().invoke(main, ["batch", "run", "-", "-o", str(out)], input=text)
    assert res.exit_code == 0, res.output
    assert "stdin:2:" in res.stderr
    assert [r["file"] for r in results(out) if "error" in r] == ["stdin"]
    assert fake_farm[0].submitted == [
        b.derive_id("stdin", 1, '{"code": "1"}'),
        b.derive_id("stdin", 3, '{"code": "2"}'),
    ]
    assert not list(Path(tempfile.gettempdir()).glob("sandfarm-stdin-*"))  # spool removed


def test_cli_stdin_over_the_bound_is_refused(tmp_path: Path, fake_farm, monkeypatch) -> None:
    monkeypatch.setattr("producer.commands.batch.MAX_STDIN_BYTES", 10)
    res = CliRunner().invoke(
        main, ["batch", "run", "-", "-o", str(tmp_path / "r")], input='{"code": "1"}\n' * 3
    )
    assert res.exit_code == 2 and "stdin: more than" in res.stderr
    assert not fake_farm


def test_cli_ctrl_c_cancels_on_request_and_a_second_one_is_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = jsonl(tmp_path / "jobs.jsonl", [{"code": str(i)} for i in range(4)])
    out = tmp_path / "r.jsonl"
    clients: list[FakeClient] = []

    def factory(redis_url=None, settings=None, **kw):
        clients.append(FakeClient(interrupt_after=1, **kw))
        return clients[-1]

    fake_module(monkeypatch, factory)
    argv = ["batch", "run", str(jobs), "-o", str(out)]
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == 130
    assert "interrupted: 3 submitted jobs have no result yet and keep running" in res.stderr
    assert clients[-1].cancelled == []

    out.unlink()
    res = CliRunner().invoke(main, [*argv, "--cancel-on-interrupt"])
    assert res.exit_code == 130
    assert "cancelled 3 jobs (0 had already ended)" in res.stderr
    assert len(clients[-1].cancelled) == 3

    def cancel_then_ctrl_c(job_id: str) -> bool:
        if clients[-1].cancelled:
            raise KeyboardInterrupt
        clients[-1].cancelled.append(job_id)
        return True

    out.unlink()
    monkeypatch.setattr(FakeClient, "cancel", lambda self, job_id: cancel_then_ctrl_c(job_id))
    res = CliRunner().invoke(main, [*argv, "--cancel-on-interrupt"])
    assert res.exit_code == 130 and "Traceback" not in res.output
    assert "cancelling stopped: cancelled 1 of 3; the others keep running" in res.stderr
