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


SURROGATE = "\ud800"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"steps": [{"kind": "write_file", "path": "a", "content": SURROGATE}]}, "steps.0.content"),
        ({"steps": [{"kind": "write_file", "path": "a" + SURROGATE}]}, "steps.0.path"),
        ({"steps": [{"kind": "read_file", "path": "a" + SURROGATE}]}, "steps.0.path"),
        ({"steps": [{"kind": "bash", "command": "cat", "stdin": SURROGATE}]}, "steps.0.stdin"),
        ({"code": "print(1)", "collect": [SURROGATE + "*"]}, "collect.0"),
        ({"command": "true", "image": "x" + SURROGATE}, "image"),
        ({"command": "true", "files": {"a": SURROGATE}}, "files.a"),
        ({"command": "true", "env": {"A": SURROGATE}}, "env.A"),
        ({"command": "true", "labels": {"k": SURROGATE}}, "labels.k"),
        ({"code": SURROGATE}, "code"),
    ],
)
def test_text_that_is_not_unicode_is_rejected_with_its_field(spec: dict, field: str) -> None:
    # JSON can carry a lone surrogate ("\ud800"); no file, argv or message can hold one
    with pytest.raises(SpecError) as caught:
        parse_spec(spec)
    assert caught.value.field == field
    assert "lone surrogate" in caught.value.reason


def test_a_key_that_is_not_unicode_is_rejected_and_its_name_can_be_printed() -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec({"command": "true", "labels": {SURROGATE: "x"}})
    assert caught.value.field.startswith("labels.")
    str(caught.value).encode("utf-8")  # printable, sendable as JSON


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"id": "job-1\n", "code": "1"}, "id"),
        ({"code": "1", "env": {"NAME\n": "x"}}, "env"),
    ],
)
def test_a_name_with_a_trailing_newline_is_refused(spec: dict, field: str) -> None:
    """`$` also matches before a final newline: names are matched whole (fullmatch), so
    none carries a newline into keys, headers or logs."""
    with pytest.raises(SpecError) as caught:
        parse_spec(spec)
    assert caught.value.field.startswith(field), caught.value


def test_gateway_and_tenant_names_are_matched_whole() -> None:
    from producer.gateway.routes import CURSOR_RE, ID_RE
    from producer.protocol.ids import CLIENT_ID_RE
    from producer.protocol.tenants import TENANT_RE

    for pattern, good in [
        (ID_RE, "job-1"),
        (CLIENT_ID_RE, "client-1"),
        (TENANT_RE, "team-a"),
        (CURSOR_RE, "12.5~job-1"),
    ]:
        assert pattern.fullmatch(good) and not pattern.fullmatch(good + "\n"), pattern.pattern


BAD_CLIENT_IDS = ["alice:batch", "two words", "x" * 65, "line\n", "é", "\ud800", "a/b", "*"]


@pytest.mark.parametrize("name", BAD_CLIENT_IDS)
def test_a_client_id_is_checked_as_the_gateway_checks_its_header(name: str) -> None:
    """Both SDKs refuse a client name the gateway would refuse (before any connection),
    with the field named: a ":" in the trusted SDK's name would reach a gateway tenant's
    completion list ("done:<tenant>:<client>"), a newline or non-ASCII a broken header."""
    from producer.client import FarmClient
    from producer.gateway_client import GatewayClient
    from producer.protocol import get_settings

    closed = get_settings(redis_url="redis://127.0.0.1:1/0")  # nothing answers there
    for make in (
        lambda: FarmClient(settings=closed, client_id=name),
        lambda: GatewayClient("http://127.0.0.1:1", "key", client_id=name),
    ):
        with pytest.raises(SpecError) as caught:
            make()
        assert caught.value.field == "client_id"
        assert "1-64 of [A-Za-z0-9._@-]" in str(caught.value)


def test_a_good_or_missing_client_id_is_kept_or_made() -> None:
    from producer.gateway_client import GatewayClient
    from producer.protocol.ids import CLIENT_ID_RE, client_id

    for name in ("batch-1_A", "worker-1.example.com", "ci@host", "x" * 64):
        assert client_id(name) == name
    made = {client_id(None) for _ in range(99)} | {client_id("")}
    assert len(made) == 100 and all(CLIENT_ID_RE.fullmatch(name) for name in made)
    gateway = GatewayClient("http://127.0.0.1:1", "key", client_id="reader")
    assert gateway.http.headers["Sandfarm-Client"] == "reader"


def test_a_body_of_another_model_is_explained_with_its_own_fields() -> None:
    """The gateway's bodies (a list of jobs, a list of ids) name their own fields."""
    from pydantic import BaseModel, ValidationError

    from sandbox_core.models import JobSpec
    from sandbox_core.validation import explain

    class Ids(BaseModel, extra="forbid"):
        ids: list[str]

    class Jobs(BaseModel, extra="forbid"):
        jobs: list[JobSpec]

    def error(model: type[BaseModel], data: dict) -> str:
        with pytest.raises(ValidationError) as info:
            model.model_validate(data)
        return str(explain(info.value.errors(), model))

    assert error(Ids, {"idz": []}).startswith("idz: unknown field; did you mean 'ids'?")
    assert error(Ids, {"command": "x"}).startswith("command: unknown field; known: ids")
    steps = {"jobs": [{"steps": [{"kind": "bash", "comand": "x"}]}]}
    assert error(Jobs, steps).startswith("jobs.0.steps.0.comand: unknown field; did you mean")
    top = {"jobs": [{"command": "x", "timeout": 1}]}
    assert error(Jobs, top).startswith("jobs.0.timeout: unknown field; did you mean 'limits.")
