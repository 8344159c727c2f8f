"""The batch runner without a farm: ids, parsing, resume, chunking, summary, CLI usage."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from producer import batch as b
from producer.cli import main
from sandbox_core import JobResult, JobSpec, Status
from sandbox_core.models import _ID_RE


class FakeClient:
    """Answers every job at once (status from the ``fake`` label), except those in ``hang``."""

    def __init__(self, hang: Iterable[str] = (), duplicate: bool = False) -> None:
        self.hang = set(hang)
        self.duplicate = duplicate
        self.submitted: list[str] = []
        self.calls: list[int] = []
        self.answered: set[str] = set()
        self.max_inflight = 0

    def submit_many(self, specs: Iterable[JobSpec]) -> list[str]:
        specs = list(specs)
        self.calls.append(len(specs))
        self.submitted += [s.id for s in specs]
        self.specs = {**getattr(self, "specs", {}), **{s.id: s for s in specs}}
        inflight = len(set(self.submitted) - self.answered)
        self.max_inflight = max(self.max_inflight, inflight)
        return [s.id for s in specs]

    def as_completed(self, ids: Sequence[str], timeout: float | None = None) -> Iterator[JobResult]:
        for job_id in ids:
            if job_id in self.hang:
                continue
            spec = self.specs[job_id]
            self.answered.add(job_id)
            result = JobResult(
                id=job_id,
                status=Status(spec.labels.get("fake", "succeeded")),
                labels=spec.labels,
                timings={
                    "queued_at": datetime.now(UTC),
                    "run_ms": float(spec.labels.get("run_ms", 10)),
                    "queue_wait_ms": 1.0,
                },
            )
            yield result
            if self.duplicate:
                yield result
        if self.hang:
            raise TimeoutError("fake timeout")


def jsonl(path: Path, lines: list[object]) -> Path:
    path.write_text(
        "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines),
    )
    return path


def results(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


QUIET = Console(stderr=True, quiet=True)


def run(inputs, output, client, **kw):
    kw.setdefault("stderr", QUIET)
    kw.setdefault("progress", False)
    return b.run_batch(inputs, output, client, **kw)


# ---------------------------------------------------------------- ids


def test_derived_id_is_stable_and_content_addressed() -> None:
    a = b.derive_id("jobs.jsonl", 3, '{"code": "print(1)"}')
    assert a == b.derive_id("/elsewhere/jobs.jsonl", 3, '  {"code": "print(1)"}\n')
    assert a.startswith("jobs:3:")
    assert a != b.derive_id("jobs.jsonl", 4, '{"code": "print(1)"}')
    assert a != b.derive_id("jobs.jsonl", 3, '{"code": "print(2)"}')
    assert a != b.derive_id("other.jsonl", 3, '{"code": "print(1)"}')
    assert b.derive_id("jobs.jsonl", 3, '{"code": "print(1)"}', prefix="run 7") == "run-7:" + a


@pytest.mark.parametrize(
    "name", ["-odd name!.jsonl", "x" * 300 + ".jsonl", "ünïcode.jsonl", ".jsonl", "a/b/.hidden"]
)
def test_derived_id_is_always_a_valid_job_id(name: str) -> None:
    job_id = b.derive_id(name, 10**9, "{}", prefix="." * 40)
    assert _ID_RE.match(job_id), job_id
    JobSpec(id=job_id, command="true")


def test_parse_line_reasons() -> None:
    assert b.parse_line("f", 1, "{nope").error.startswith("json: not valid JSON")
    assert b.parse_line("f", 2, "[1]").error == "job: a job is a JSON object, got list"
    unknown = b.parse_line("f", 3, '{"command": "true", "timeout": 5}')
    assert unknown.error == "timeout: unknown field; did you mean 'limits.timeout_s'?"
    over = b.parse_line("f", 4, '{"command": "true", "limits": {"timeout_s": 99999}}')
    assert over.error.startswith("limits.timeout_s:")
    assert b.parse_line("f", 5, "{}").error.startswith("steps:")
    assert b.parse_line("f", 6, '{"id": "mine", "code": "1"}').id == "mine"
    assert b.parse_line("f", 7, '{"code": "1"}').id == b.derive_id("f", 7, '{"code": "1"}')


# ---------------------------------------------------------------- summary


def test_percentile_nearest_rank() -> None:
    values = list(range(1, 11))
    assert b.percentile([], 50) is None
    assert b.percentile(values, 50) == 5
    assert b.percentile(values, 95) == 10
    assert b.percentile([7.0], 95) == 7.0
    assert b.percentile(values, 0) == 1


def test_summary_counts_and_expectations() -> None:
    s = b.Summary()
    s.add({"id": "a", "status": "succeeded", "timings": {"run_ms": 100, "queue_wait_ms": 5}})
    s.add(
        {"id": "b", "status": "failed", "timings": {"run_ms": 300}, "labels": {"expect": "failed"}}
    )
    s.add({"id": "c", "status": "failed", "timings": {}, "labels": {"expect": "succeeded"}})
    s.invalid = 2
    assert s.jobs == 3 and s.statuses == {"failed": 2, "succeeded": 1}
    assert s.run_ms == [100, 300] and s.queue_wait_ms == [5]
    assert s.expected == 2 and s.mismatches == [("c", "succeeded", "failed")]
    console = Console(record=True, width=100)
    console.print(s.render(elapsed_s=2.0, resumed=1, missing=1))
    text = console.export_text()
    for needle in (
        "failed",
        "invalid",
        "p95",
        "300 ms",
        "1/2 as labelled",
        "c: expected",
        "2 new in 2.0 s",
        "1 from an earlier run",
        "1 still without a result",
    ):
        assert needle in text, text


# ---------------------------------------------------------------- run_batch


def mixed(tmp_path: Path) -> Path:
    return jsonl(
        tmp_path / "jobs.jsonl",
        [
            {"command": "echo 1"},
            "{not json",
            "",
            {"command": "echo 2", "timeout": 3},
            {"code": "1", "limits": {"memory_mb": 10**9}},
            {"id": "explicit", "code": "2", "labels": {"fake": "failed"}},
            {"id": "explicit", "code": "3"},
            {"command": "echo 3", "labels": {"fake": "timed_out", "run_ms": "900"}},
        ],
    )


def test_bad_lines_reported_good_lines_run_once(tmp_path: Path) -> None:
    jobs, out = mixed(tmp_path), tmp_path / "results.jsonl"
    client = FakeClient(duplicate=True)
    report = run([jobs], out, client)
    assert report.completed and report.lines == 7 and report.invalid == 4
    lines = results(out)
    errors = {r["line"]: r["error"] for r in lines if "error" in r}
    assert sorted(errors) == [2, 4, 5, 7]
    assert errors[2].startswith("json:")
    assert errors[4].startswith("timeout:")
    assert errors[5].startswith("limits.memory_mb:")
    assert "already used by jobs.jsonl line 6" in errors[7]
    assert all(r["file"] == "jobs.jsonl" for r in lines if "error" in r)
    done = [r for r in lines if "status" in r]
    assert sorted(client.submitted) == sorted(r["id"] for r in done)
    assert len(done) == 3 == len({r["id"] for r in done})  # duplicates never reach RESULTS
    assert report.summary.statuses == {"succeeded": 1, "failed": 1, "timed_out": 1}
    JobResult.model_validate(done[0])


def test_resume_skips_done_ids_and_does_not_repeat_error_lines(tmp_path: Path) -> None:
    jobs, out = mixed(tmp_path), tmp_path / "results.jsonl"
    run([jobs], out, FakeClient())
    first = out.read_text()
    again = FakeClient()
    report = run([jobs], out, again)
    assert again.submitted == [] and report.resumed == 3 and report.completed
    assert out.read_text() == first
    assert report.summary.jobs == 3 and report.summary.invalid == 4

    # Drop one result and tear the last line as a crash would: only that job runs again.
    kept = [line for line in first.splitlines() if '"id":"explicit"' not in line]
    out.write_text("\n".join(kept) + '\n{"id": "torn", "sta')
    third = FakeClient()
    report = run([jobs], out, third)
    assert third.submitted == ["explicit"] and report.resumed == 2
    assert out.read_text().splitlines()[-2] == '{"id": "torn", "sta'
    assert sum("status" in r for r in results_tolerant(out)) == 3


def results_tolerant(path: Path) -> list[dict]:
    return list(b.read_results(path))


def test_chunks_and_window_bound_inflight(tmp_path: Path) -> None:
    jobs = jsonl(tmp_path / "many.jsonl", [{"command": f"echo {i}"} for i in range(103)])
    out = tmp_path / "r.jsonl"
    client = FakeClient()
    report = run([jobs], out, client, chunk=10, window=30)
    assert report.submitted == 103 and report.received == 103 and report.completed
    assert max(client.calls) <= 10 and sum(client.calls) == 103
    assert client.max_inflight <= 30
    assert [r["id"] for r in results(out)] == client.submitted


def test_timeout_counts_missing(tmp_path: Path) -> None:
    jobs = jsonl(tmp_path / "j.jsonl", [{"command": "echo a"}, {"command": "sleep 1"}])
    stuck = b.derive_id("j.jsonl", 2, json.dumps({"command": "sleep 1"}))
    report = run([jobs], tmp_path / "r.jsonl", FakeClient(hang=[stuck]), timeout=0.2)
    assert report.received == 1 and report.missing == 1 and not report.completed


def test_several_inputs_one_results_file(tmp_path: Path) -> None:
    a = jsonl(tmp_path / "a.jsonl", [{"command": "echo a"}, "oops"])
    c = jsonl(tmp_path / "c.jsonl", [{"command": "echo a"}, "oops"])
    out = tmp_path / "r.jsonl"
    report = run([a, c], out, FakeClient())
    assert report.received == 2 and report.invalid == 2
    assert {(r["file"], r["line"]) for r in results(out) if "error" in r} == {
        ("a.jsonl", 2),
        ("c.jsonl", 2),
    }


# ---------------------------------------------------------------- CLI


@pytest.fixture
def fake_farm(monkeypatch: pytest.MonkeyPatch) -> list[FakeClient]:
    made: list[FakeClient] = []

    def factory(redis_url: str | None = None) -> FakeClient:
        made.append(FakeClient())
        return made[-1]

    module = types.ModuleType("producer.client")
    module.FarmClient = factory  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "producer.client", module)
    return made


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
    ],
)
def test_cli_bad_usage_exits_2(tmp_path: Path, fake_farm, args: list[str]) -> None:
    jobs = mixed(tmp_path)
    argv = [a.format(jobs=jobs, tmp=tmp_path) for a in args]
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == 2, res.output
    assert not fake_farm or not fake_farm[0].submitted


def test_cli_farm_failure_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(redis_url: str | None = None):
        raise ConnectionError("Redis at redis://nowhere refused")

    module = types.ModuleType("producer.client")
    module.FarmClient = broken  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "producer.client", module)
    res = CliRunner().invoke(
        main, ["batch", "run", str(mixed(tmp_path)), "-o", str(tmp_path / "r")]
    )
    assert res.exit_code == 1
    assert "refused" in res.stderr
