"""The spec hash a worker holds its result to (worker.jobs.spec_digest_of) is the same
hash the client's submission wrote, for the spec as the worker gets it: the message's
JSON, decoded as kombu decodes it. A hash that differed would refuse every result of
such a job (lib_store.lua orphaned)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from kombu.utils.json import loads as kombu_loads

from producer.protocol import MessageMeta
from producer.protocol.submission import prepare_all
from producer.protocol.tenants import Policy
from sandbox_core import JobSpec
from worker.jobs import spec_digest_of

SPECS = [
    {"id": "a", "code": "print('héllo ✓ 𝄞')\n", "labels": {"k": "v\u2028w"}},
    {"id": "b", "command": "echo $X", "env": {"X": "1e16", "Y": "\u00e9"}},
    {"id": "c", "code": "pass", "limits": {"timeout_s": 2.5, "memory_mb": 300}},
    {"id": "d", "code": "x", "limits": {"timeout_s": 0.1 + 0.2}},
    {"id": "e", "files": {"in/data.txt": "Z" * 100}, "command": "cat in/data.txt"},
    {"id": "f", "steps": [{"kind": "python", "code": "1"}, {"kind": "bash", "command": "true"}]},
]


@pytest.mark.parametrize("raw", SPECS, ids=[s["id"] for s in SPECS])
def test_the_workers_hash_is_the_one_the_client_submitted(raw: dict) -> None:
    spec = JobSpec.model_validate(raw)
    now = datetime.now(UTC)
    (prepared,) = prepare_all([spec], "team", Policy(), "client-1", "q", now, "p:")
    message = json.loads(prepared.submission.message)
    args = kombu_loads(message["body"])[0]  # as the worker's task gets them
    assert MessageMeta.model_validate(args[1]).notify == "client-1"  # the message, whole
    assert spec_digest_of(args[0]) == prepared.submission.spec_hash


def test_a_spec_that_is_no_dict_or_no_json_is_stored_unchecked() -> None:
    assert spec_digest_of(None) == ""
    assert spec_digest_of({"code": "x", "when": datetime.now(UTC)}) == ""  # not JSON
