"""A submitted job's state record and message, written per call (submission.prepare_all),
are the ones the records' models write; the ids and delivery tags are version-4 UUIDs."""

from __future__ import annotations

import json
import math
import re
import uuid
from datetime import UTC, datetime

import pytest
from pydantic_core import PydanticSerializationError

from producer.protocol.ids import random_hex_id, random_uuid
from producer.protocol.records import JobState, MessageMeta
from producer.protocol.submission import _call, _state, prepare_all
from producer.protocol.tenants import Policy
from sandbox_core import JobSpec

NOW = datetime(2026, 12, 4, 23, 59, 59, 999999, tzinfo=UTC)


@pytest.mark.parametrize("notify", [None, "c1", 'quote" back\\slash', "é—\u2028雪", "\x00\x1f"])
@pytest.mark.parametrize(
    "slot_s", [1, 0.001, 10.0, 2.5, 86400, 1e-07, 123456789.125, math.inf, math.nan]
)
def test_state_record_is_the_models_own(notify: str | None, slot_s: float) -> None:
    call = _call("t", Policy(), notify, "q", NOW, "p:")
    digest = "0123456789abcdef" * 2
    mine = _state(call, 4321, digest, slot_s)
    theirs = JobState(kept=4321, at=NOW, notify=notify, spec=digest, slot_s=slot_s).dump()
    assert mine == theirs
    assert mine.startswith('{"kept":4321,"at":"2026-12-04')  # where the scripts read them


def test_state_record_names_every_field_of_the_model() -> None:
    # _state writes JobState by hand: a field added to the model must be added there too
    assert list(JobState.model_fields) == ["kept", "at", "notify", "spec", "slot_s"]


def test_a_client_name_that_is_no_unicode_is_refused_before_redis() -> None:
    with pytest.raises(PydanticSerializationError):  # as JobState.dump() refuses it
        prepare_all([JobSpec(command="true", id="a")], "t", Policy(), "x\udc80", "q", NOW, "p:")


@pytest.mark.parametrize("notify", [None, "client-ü"])
def test_each_message_carries_the_models_meta(notify: str | None) -> None:
    policy = Policy(result_ttl_s=3600)
    specs = [JobSpec(command=f"echo {i}", id=f"job-{i}", labels={"n": str(i)}) for i in range(3)]
    prepared = prepare_all(specs, "team", policy, notify, "q", NOW, "p:")
    for spec, job in zip(specs, prepared, strict=True):
        assert spec.id is not None
        body = json.loads(json.loads(job.submission.message)["body"])
        meta = MessageMeta(
            id=spec.id, tenant="team", ttl=3600, queued_at=NOW, notify=notify
        ).model_dump(mode="json", exclude_none=True)
        assert body[0][1] == meta
        assert list(body[0][1]) == list(meta)  # in the same order
        assert job.submission.qid == f"team/{spec.id}"
        assert job.day == "20261204"


def test_jobs_prepared_together_are_the_ones_prepared_alone() -> None:
    policy = Policy()
    specs = [JobSpec(command="true", id="a"), JobSpec(code="print(1)", id="b", labels={"x": "y"})]
    together = prepare_all(specs, "t", policy, "n", "q", NOW, "p:")
    alone = [prepare_all([spec], "t", policy, "n", "q", NOW, "p:")[0] for spec in specs]
    for one, other in zip(together, alone, strict=True):
        assert one.submission.state == other.submission.state
        assert one.submission.spec_hash == other.submission.spec_hash
        mine, theirs = json.loads(one.submission.message), json.loads(other.submission.message)
        tags = {m["properties"].pop("delivery_tag") for m in (mine, theirs)}
        assert len(tags) == 2  # each message its own tag
        assert mine == theirs


def test_random_ids_are_version_4_uuids_and_distinct() -> None:
    ids = [random_hex_id() for _ in range(20000)]
    assert len(set(ids)) == len(ids)
    for value in ids[:2000]:
        assert re.fullmatch(r"[0-9a-f]{32}", value)
        parsed = uuid.UUID(hex=value)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
        assert parsed.hex == value
    tag = random_uuid()
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", tag)
    assert str(uuid.UUID(tag)) == tag
