"""Errors that help: the field as written, the reason in plain words, the nearest name."""

from __future__ import annotations

import pytest

from sandbox_core import SpecError, parse_spec


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"comand": "ls"}, "comand: unknown field; did you mean 'command'?"),
        (
            {"steps": [{"kind": "bash", "comand": "ls"}]},
            "steps.0.comand: unknown field; did you mean 'command'?",
        ),
        (
            {"code": "1", "limits": {"memroy_mb": 5}},
            "limits.memroy_mb: unknown field; did you mean 'memory_mb'?",
        ),
        (
            {"command": "x", "timeout": 5},
            "timeout: unknown field; did you mean 'limits.timeout_s'?",
        ),
        (
            {"steps": [{"kind": "bsh", "command": "ls"}]},
            "steps.0: kind 'bsh' is not a step kind; choose one of bash, python, write_file,"
            " read_file (did you mean 'bash'?)",
        ),
        (
            {"code": "1", "files": {"/etc/x": "a"}},
            "files./etc/x: is absolute; paths are relative to the workspace (got '/etc/x')",
        ),
        ({"steps": [{"kind": "write_file", "path": "a/../../x"}]}, "steps.0.path: contains '..'"),
        ({"steps": [{"kind": "bash"}]}, "steps.0.command: field required"),
    ],
)
def test_errors_name_the_field_and_help(spec: dict, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    text = str(info.value)
    assert text.startswith(message), text
    assert "Value error" not in text and "(and 1 more)" not in text
