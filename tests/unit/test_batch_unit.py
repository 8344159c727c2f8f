"""The batch runner without a farm: ids, parsing, resume, chunking, summary, CLI usage."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from rich.console import Console

from producer import batch as b
from producer.protocol import IdConflictError
from sandbox_core import JobResult, JobSpec, SpecError, Status
from sandbox_core.models import _ID_RE


@dataclass
class FakeClient:
    """Answers every job at once (status from the ``fake`` label), except those in ``hang``.

    ``taken``: ids the farm already holds for another spec (submit_many refuses them as
    FarmClient does); ``done_before``: ids whose result started before this run."""

    hang: Collection[str] = ()
    duplicate: bool = False
    taken: Collection[str] = ()
    done_before: Collection[str] = ()
    notices: list[str] = field(default_factory=list)
    interrupt_after: int | None = None
    submitted: list[str] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    answered: set[str] = field(default_factory=set)
    cancelled: list[str] = field(default_factory=list)
    specs: dict[str, JobSpec] = field(default_factory=dict)
    max_inflight: int = 0

    def submit_many(self, specs: Iterable[JobSpec]) -> list[str]:
        specs = list(specs)
        self.calls.append(len(specs))
        accepted = [s for s in specs if s.id not in self.taken]
        self.submitted += [s.id for s in accepted]
        self.specs.update({s.id: s for s in accepted})
        inflight = len(set(self.submitted) - self.answered)
        self.max_inflight = max(self.max_inflight, inflight)
        conflicts = [s.id for s in specs if s.id in self.taken]
        if conflicts:
            raise IdConflictError(conflicts, [s.id for s in accepted])
        return [s.id for s in accepted]

    def as_completed(
        self, ids: Sequence[str], timeout: float | None = None, *, notice=None
    ) -> Iterator[JobResult]:
        for message in self.notices:
            notice(message)
        self.notices = []
        for job_id in ids:
            if job_id in self.hang:
                continue
            if self.interrupt_after is not None and len(self.answered) >= self.interrupt_after:
                raise KeyboardInterrupt
            spec = self.specs[job_id]
            self.answered.add(job_id)
            now = datetime.now(UTC)
            started = now - timedelta(hours=1) if job_id in self.done_before else now
            result = JobResult(
                id=job_id,
                status=Status(spec.labels.get("fake", "succeeded")),
                labels=spec.labels,
                timings={
                    "queued_at": started,
                    "started_at": started,
                    "run_ms": float(spec.labels.get("run_ms", 10)),
                    "queue_wait_ms": 1.0,
                },
            )
            yield result
            if self.duplicate:
                yield result
        if self.hang:
            raise TimeoutError("fake timeout")

    def cancel(self, job_id: str) -> bool:
        self.cancelled.append(job_id)
        return job_id not in self.answered

    def close(self) -> None:
        pass


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
    report = run([jobs], tmp_path / "r.jsonl", FakeClient(hang=[stuck]), wait_timeout=0.2)
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


# ---------------------------------------------------------------- ids, prefixes, defaults


def test_prefix_namespaces_explicit_ids_too() -> None:
    assert b.parse_line("f", 1, '{"id": "mine", "code": "1"}', prefix="p1").id == "p1:mine"
    derived = b.parse_line("f", 2, '{"code": "1"}', prefix="p1").id
    assert derived == b.derive_id("f", 2, '{"code": "1"}', prefix="p1")
    assert derived.startswith("p1:f:2:")
    fits = json.dumps({"id": "x" * 125, "code": "1"})
    assert b.parse_line("f", 3, fits, prefix="ab").id == "ab:" + "x" * 125  # 128 exactly
    too_long = b.parse_line("f", 4, fits, prefix="abc")
    assert isinstance(too_long, b.LineError)
    assert too_long.error == (
        f"id: {'x' * 125!r} is too long with --id-prefix 'abc': 129 characters, at most 128"
    )


def test_defaults_fill_only_what_a_line_leaves_unset() -> None:
    defaults = b.Defaults(backend="bwrap", timeout_s=5.0, memory_mb=64)
    bare = b.parse_line("f", 1, '{"command": "true"}', defaults=defaults)
    assert (bare.backend, bare.limits.timeout_s, bare.limits.memory_mb) == ("bwrap", 5.0, 64)
    own = '{"command": "true", "backend": "process", "limits": {"timeout_s": 9, "memory_mb": 99}}'
    mine = b.parse_line("f", 2, own, defaults=defaults)
    assert (mine.backend, mine.limits.timeout_s, mine.limits.memory_mb) == ("process", 9, 99)
    # Not an object: the spec's own error, not a crash in the defaults.
    assert b.parse_line("f", 3, '{"command": "true", "limits": 5}', defaults=defaults).error


def test_a_default_that_changes_the_spec_changes_the_derived_id() -> None:
    text = '{"command": "true"}'
    plain = b.parse_line("f", 1, text).id
    assert plain == b.derive_id("f", 1, text)  # no default taken: the id of old
    five = b.parse_line("f", 1, text, defaults=b.Defaults(timeout_s=5.0)).id
    six = b.parse_line("f", 1, text, defaults=b.Defaults(timeout_s=6.0)).id
    assert len({plain, five, six}) == 3
    own = '{"command": "true", "limits": {"timeout_s": 9}}'
    assert b.parse_line("f", 1, own, defaults=b.Defaults(timeout_s=5.0)).id == b.derive_id(
        "f", 1, own
    )  # the line's own value wins, so the default does not touch its id


# ---------------------------------------------------------------- conflicts


def test_id_taken_by_another_spec_is_an_invalid_line_the_rest_run(tmp_path: Path) -> None:
    jobs = jsonl(
        tmp_path / "jobs.jsonl",
        [{"id": "a", "code": "1"}, {"id": "taken", "code": "2"}, {"code": "3"}],
    )
    out = tmp_path / "r.jsonl"
    report = run([jobs], out, FakeClient(taken=["taken"]), chunk=2)
    assert report.completed and report.invalid == 1 and report.conflicts == 1
    errors = [r for r in results(out) if "error" in r]
    assert errors == [
        {
            "line": 2,
            "file": "jobs.jsonl",
            "error": "id: 'taken' already names a different job (the farm holds another"
            " spec under it): give this line another id, or run with a new --id-prefix",
        }
    ]
    assert sorted(r["id"] for r in results(out) if "status" in r)[0] == "a"
    assert report.received == 2 and report.summary.invalid == 1


def test_resumed_own_id_whose_spec_changed_is_refused_not_resumed(tmp_path: Path) -> None:
    from producer.batch import ledger

    jobs = jsonl(tmp_path / "jobs.jsonl", [{"id": "pin", "code": "1"}, {"code": "2"}])
    out = tmp_path / "r.jsonl"
    run([jobs], out, FakeClient())
    recorded = {"pin": ledger.digest(b.parse_line("jobs.jsonl", 1, '{"id": "pin", "code": "1"}'))}
    lookup = lambda ids: {i: recorded[i] for i in ids if i in recorded}  # noqa: E731

    same = run([jobs], out, FakeClient(), recorded=lookup)
    assert same.resumed == 2 and same.invalid == 0

    jsonl(jobs, [{"id": "pin", "code": "1 + 1"}, {"code": "2"}])  # edited under its id
    again = FakeClient()
    report = run([jobs], out, again, recorded=lookup)
    assert again.submitted == [] and report.resumed == 1 and report.invalid == 1
    assert "already names a different job" in results(out)[-1]["error"]
    assert results(out)[-1]["line"] == 1
    assert report.summary.jobs == 1  # the old verdict is not counted as this line's


# ---------------------------------------------------------------- this run, notices, Ctrl-C


def test_results_done_before_this_run_are_not_new(tmp_path: Path) -> None:
    jobs = jsonl(tmp_path / "jobs.jsonl", [{"code": str(i)} for i in range(3)])
    old = [b.derive_id("jobs.jsonl", n, json.dumps({"code": str(n - 1)})) for n in (1, 2)]
    report = run([jobs], tmp_path / "r.jsonl", FakeClient(done_before=old))
    assert report.received == 3 and report.earlier == 2
    console = Console(record=True, width=120)
    console.print(report.summary.render(10.0, resumed=0, earlier=report.earlier))
    text = console.export_text()
    assert "3 results: 1 new in 10.0 s (0.1 jobs/s); 2 already done before this run" in text


def test_notice_goes_through_the_console(tmp_path: Path) -> None:
    jobs = jsonl(tmp_path / "jobs.jsonl", [{"code": "1"}])
    console = Console(record=True, width=200)
    message = "no worker consumes queue q at redis://x/0; still waiting"
    run([jobs], tmp_path / "r.jsonl", FakeClient(notices=[message]), stderr=console)
    assert f"sandfarm: {message}" in console.export_text()


def test_ctrl_c_ends_the_run_with_what_is_still_out(tmp_path: Path) -> None:
    jobs = jsonl(tmp_path / "jobs.jsonl", [{"code": str(i)} for i in range(4)])
    out = tmp_path / "r.jsonl"
    report = run([jobs], out, FakeClient(interrupt_after=1))
    assert report.interrupted and not report.completed
    assert report.received == 1 and len(report.unanswered) == 3 and report.missing == 3
    assert len(results(out)) == 1


def test_output_stream_gets_the_results_and_nothing_is_resumed(tmp_path: Path) -> None:
    import io

    jobs = jsonl(tmp_path / "jobs.jsonl", [{"code": "1"}, "bad"])
    stream = io.StringIO()
    report = run([jobs], stream, FakeClient())
    lines = [json.loads(x) for x in stream.getvalue().splitlines()]
    assert report.received == 1 and [("status" in x) for x in lines] == [False, True]


# ---------------------------------------------------------------- progress line


def progress_text(width: int, total: int, done: int, counts: dict[str, int]) -> list[str]:
    console = Console(width=width, force_terminal=True, record=True)
    bar = b.BatchProgress(console)
    bar.update(bar.add_task("jobs", total=total, counts=counts), advance=done)
    console.print(bar)
    return console.export_text().splitlines()


FINAL = [s.value for s in Status if s not in (Status.QUEUED, Status.RUNNING)]


@pytest.mark.parametrize("big", [False, True])
def test_progress_line_fits_80_columns_with_every_status(big: bool) -> None:
    from producer.batch.progress import SHORT_NAMES

    counts = {name: (1000 * (n + 1) + n if big else n + 1) for n, name in enumerate(FINAL)}
    assert len(counts) == 10  # every final status, wrong_answer included
    total, done = (1_000_000, 123_456) if big else (1000, 123)
    lines = progress_text(80, total, done, counts)
    assert all(len(line) <= 80 for line in lines), lines
    assert len(lines) > 1 if big else len(lines) == 1, lines  # thousands each: tally below
    text = " ".join(lines)
    for status, count in counts.items():
        assert f"{status} {count}" in text or f"{SHORT_NAMES[status]} {count}" in text, text
    assert f"{done}/{total}" in text


def test_progress_line_keeps_full_names_and_times_when_they_fit() -> None:
    (line,) = progress_text(120, 10, 0, {"succeeded": 7, "failed": 1})
    assert "jobs" in line and "succeeded 7 failed 1" in line and "-:--:--" in line
    assert len(line) <= 120


def test_a_results_file_is_written_by_one_run_at_a_time(tmp_path: Path) -> None:
    """Two runs on one RESULTS file at once each wrote every result, doubling the file
    (a review): the second is refused, naming the file, and writes nothing."""
    import fcntl

    jobs, out = mixed(tmp_path), tmp_path / "results.jsonl"
    with out.open("a") as other_run:
        fcntl.flock(other_run.fileno(), fcntl.LOCK_EX)
        client = FakeClient()
        with pytest.raises(SpecError, match="another `sandfarm batch run` writes it"):
            run([jobs], out, client)
        assert client.submitted == [] and out.read_text() == ""
    report = run([jobs], out, FakeClient())  # once the other run is done
    assert report.completed and results(out)
