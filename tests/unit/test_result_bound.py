"""bounded() skips serialising a result whose JSON provably fits: json_upper_bound must
be above the real size for any content, every text field included."""

from __future__ import annotations

import random
import types
import typing
from datetime import UTC, datetime

from pydantic import BaseModel

from sandbox_core import JobResult, Status
from sandbox_core.backends.outcome import bounded, json_upper_bound
from sandbox_core.models import CollectedFile, StepResult, StepStatus

WORST = '\x01\x02\x7f\u2028\U0001f600\\"' * 40  # escapes, multi-byte, quotes


def text_fields(model: type[BaseModel]) -> list[str]:
    """Every field of ``model`` that holds text (str, or str | None)."""
    return [
        name
        for name, field in model.model_fields.items()
        if field.annotation is str
        or (
            typing.get_origin(field.annotation) in (typing.Union, types.UnionType)
            and str in typing.get_args(field.annotation)
        )
    ]


def filled(model: type[BaseModel], text: str, **required: object) -> dict[str, object]:
    return {**{name: text for name in text_fields(model)}, **required}


def test_the_bound_holds_with_every_text_field_full_of_the_worst_characters() -> None:
    step = StepResult(**filled(StepResult, WORST, status=StepStatus.FAILED, exit_code=2**40))
    file = CollectedFile(**filled(CollectedFile, WORST, size=10**12, encoding="utf-8"))
    fields = filled(JobResult, WORST, status=Status.FAILED)
    result = JobResult(**fields, steps=[step] * 3, files=[file] * 2, labels={WORST: WORST})
    result.timings.queued_at = result.timings.started_at = datetime.now(UTC)
    result.timings.finished_at = datetime.now(UTC)
    result.timings.run_ms = 1e300
    real = len(result.model_dump_json())
    assert real > 10_000  # the worst content went in
    assert json_upper_bound(result) >= real


def test_the_bound_holds_for_random_results() -> None:
    rng = random.Random(3)
    for _ in range(200):
        text = "".join(
            chr(rng.choice([0, 1, 31, 34, 92, 127, 0x2028, 0x1F600, 97]))
            for _ in range(rng.randint(0, 300))
        )
        steps = [
            StepResult(kind="bash", status=StepStatus.SUCCEEDED, stdout=text, stderr=text[::-1])
            for _ in range(rng.randint(0, 4))
        ]
        result = JobResult(id="j", status=Status.SUCCEEDED, steps=steps, message=text[:50])
        assert json_upper_bound(result) >= len(result.model_dump_json())


def test_a_result_over_the_bound_is_still_cut() -> None:
    step = StepResult(kind="bash", status=StepStatus.SUCCEEDED, stdout="\x01" * 50_000)
    result = bounded(JobResult(id="j", status=Status.SUCCEEDED, steps=[step]), limit=100_000)
    assert len(result.model_dump_json()) <= 100_000 and result.steps[0].truncated
