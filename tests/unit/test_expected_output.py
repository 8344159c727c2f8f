"""Expected-output steps: validation names the field; the comparison says where."""

from __future__ import annotations

import pytest

from producer.batch import Summary
from producer.batch.progress import tally
from sandbox_core import SpecError, Status, parse_spec
from sandbox_core.backends.outcome import job_status, status_message
from sandbox_core.expected import mismatch
from sandbox_core.models import StepResult, StepStatus


def test_expected_stdout_is_part_of_the_contract():
    spec = parse_spec(
        {"code": "print(1)", "steps": []}
        if False
        else {
            "steps": [
                {
                    "kind": "python",
                    "code": "print(input())",
                    "stdin": "7\n",
                    "expected_stdout": "7\n",
                    "compare": "whitespace",
                }
            ]
        }
    )
    step = spec.steps[0]
    assert step.expected_stdout == "7\n" and step.compare == "whitespace"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("step", "field"),
    [
        ({"kind": "bash", "command": "true", "compare": "whitespace"}, "steps.0.compare"),
        (
            {"kind": "bash", "command": "true", "expected_stdout": "x", "compare": "fuzzy"},
            "steps.0.compare",
        ),
        (
            {"kind": "bash", "command": "true", "expected_stdout": "x" * 100},
            "steps.0.expected_stdout",
        ),
    ],
)
def test_bad_expected_output_names_the_field(step, field):
    with pytest.raises(SpecError) as info:
        parse_spec({"steps": [step], "limits": {"output_bytes": 64}})
    assert info.value.field == field, info.value


def test_exact_and_whitespace_compare():
    assert mismatch("1 2\n", False, "1 2\n", "exact") is None
    assert mismatch("1  2\n\n", False, "1 2\n", "exact") == "line 1: got '1  2', expected '1 2'"
    assert mismatch("1 2", False, "1 2\n", "exact") == ("got 1 lines, expected 2 (newlines count)")
    assert mismatch(" 1\t2 \n\n", False, "1 2\n", "whitespace") is None
    assert mismatch("1 3", False, "1 2", "whitespace") == "word 2: got '3', expected '2'"
    assert "longer than" in (mismatch("1 2\n", True, "1 2\n", "exact") or "")


def test_wrong_answer_is_its_own_status_below_failed():
    wa = StepResult(kind="python", status=StepStatus.WRONG_ANSWER, exit_code=0, message="line 1")
    ok = StepResult(kind="bash", status=StepStatus.SUCCEEDED, exit_code=0)
    failed = StepResult(kind="bash", status=StepStatus.FAILED, exit_code=3)
    assert job_status([ok, wa]) == Status.WRONG_ANSWER
    assert status_message([ok, wa], Status.WRONG_ANSWER) == "step 1 (python) wrong_answer: line 1"
    assert job_status([wa, failed]) == Status.FAILED
    unchecked = wa.model_copy(update={"check": False})
    assert job_status([ok, unchecked]) == Status.SUCCEEDED


def test_wrong_answer_is_counted_in_summaries():
    summary = Summary()
    summary.add({"status": "wrong_answer"})
    summary.add({"status": "succeeded"})
    assert summary.statuses["wrong_answer"] == 1
    assert "wa 1" in tally(summary.statuses, short=True).plain
