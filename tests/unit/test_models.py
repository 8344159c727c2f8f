"""The job contract: validation errors name the field; shorthands normalise to steps."""

from __future__ import annotations

import pytest

import sandbox_core
from sandbox_core import JobResult, JobSpec, SpecError, Status, parse_spec
from sandbox_core import defaults as d


def _error(spec: object) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert isinstance(info.value, ValueError)
    return info.value


def test_public_api_is_pinned():
    assert sorted(sandbox_core.__all__) == sorted(
        [
            "BACKEND_NAMES",
            "Backend",
            "BackendUnavailableError",
            "BashStep",
            "CollectedFile",
            "HeadTailBuffer",
            "JobResult",
            "JobSpec",
            "Limits",
            "PathEscapeError",
            "PolicyError",
            "Protection",
            "ProtectionUnavailableError",
            "PythonStep",
            "ReadFileStep",
            "SandfarmError",
            "SlotBusyError",
            "SpecError",
            "Status",
            "StepResult",
            "StepStatus",
            "WriteFileStep",
            "get_backend",
            "parse_spec",
        ]
    )


def test_shorthands_become_one_step():
    assert parse_spec({"code": "print(1)"}).steps[0].kind == "python"
    spec = parse_spec({"command": "ls"})
    assert spec.steps[0].kind == "bash" and spec.command is None
    assert parse_spec(spec.model_dump()).steps == spec.steps  # round trip


def test_defaults_come_from_one_place():
    limits = parse_spec({"code": "1"}).limits
    assert limits.timeout_s == d.TIMEOUT_S[0] and limits.memory_mb == d.MEMORY_MB[0]
    assert limits.network is False


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"code": "1", "limits": {"timeout_s": -1}}, "limits.timeout_s"),
        ({"code": "1", "limits": {"memory_mb": d.MEMORY_MB[1] + 1}}, "limits.memory_mb"),
        ({"code": "1", "limits": {"processes": 0}}, "limits.processes"),
        ({"code": "1", "limits": {"output_bytes": 10**9}}, "limits.output_bytes"),
        ({"code": "1", "limits": {"bogus": 1}}, "limits.bogus"),
        ({"steps": [{"kind": "rm_rf", "path": "x"}]}, "steps.0"),
        ({}, "steps"),
        ({"steps": []}, "steps"),
        ({"code": "x" * (d.MAX_SOURCE_BYTES + 1)}, "code"),
        ({"code": "1", "command": "ls"}, "command"),
        ({"code": "1", "files": {"../x": "y"}}, "files.../x"),
        ({"steps": [{"kind": "read_file", "path": "/etc/passwd"}]}, "steps.0.path"),
        ({"code": "1", "env": {"1BAD": "x"}}, "env.1BAD"),
        ({"code": "1", "env": {f"V{i}": "x" * 30000 for i in range(3)}}, "env"),  # 88 KB
        ({"code": "1", "labels": {"__type__": "decimal", "__value__": "1"}}, "labels"),
        ({"code": "1", "env": {"__type__": "uuid", "__value__": "x"}}, "env"),
        ({"code": "1", "id": "has space"}, "id"),
        ({"code": "1", "unknown": True}, "unknown"),
        ({"code": "1", "image": "x", "backend": "process"}, "image"),
    ],
)
def test_invalid_specs_name_the_field(spec, field):
    error = _error(spec)
    assert error.field == field, str(error)
    assert error.reason


def test_error_message_is_one_line_with_value():
    message = str(_error({"code": "1", "limits": {"timeout_s": 99999}}))
    assert "\n" not in message
    assert message.startswith("limits.timeout_s:") and "99999" in message


def test_json_text_is_accepted():
    assert parse_spec('{"command": "true"}').steps[0].command == "true"
    assert _error("{not json").field == "job"


def test_result_bound_is_enforced():
    steps = [{"kind": "bash", "command": "true"}] * d.MAX_STEPS
    error = _error({"steps": steps, "limits": {"output_bytes": d.OUTPUT_BYTES[1]}})
    assert error.field == "limits.output_bytes"


def test_statuses_are_exactly_the_designed_set():
    assert {s.value for s in Status} == {
        "succeeded",
        "failed",
        "timed_out",
        "memory_exceeded",
        "output_flooded",
        "crashed",
        "wrong_answer",
        "rejected",
        "error",
        "cancelled",
        "queued",
        "running",
    }
    assert not Status.QUEUED.is_final and Status.FAILED.is_final


def test_result_schema_round_trips():
    result = JobResult(id="a", status=Status.SUCCEEDED)
    assert JobResult.model_validate_json(result.model_dump_json()) == result
    assert "properties" in JobSpec.model_json_schema()


def test_a_jobs_summary_shows_labels_so_they_cannot_fake_lines_or_names() -> None:
    """Labels went raw into the summary Flower and the logs show: a newline faked a line,
    "x tenant=bob" another tenant's name (a review). Plain ones read as before; others
    are quoted, their control characters escaped."""
    from sandbox_core import parse_spec

    spec = parse_spec(
        {
            "command": "true",
            "labels": {
                "task": "HumanEval/1",
                "a": "1\nTask sandbox.run[victim] ok",
                "x": "y tenant=bob",
            },
        }
    )
    line = spec.summary("alice")
    assert "\n" not in line and line.startswith("tenant=alice ")
    assert "task=HumanEval/1" in line
    assert "a='1\\nTask sandbox.run[victim] ok'" in line and "x='y tenant=bob'" in line
