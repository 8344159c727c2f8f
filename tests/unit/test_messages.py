"""The farm's own task messages are the ones Celery would send, field by field (the body
as JSON text instead of base64), and a real worker runs them (tests/integration)."""

from __future__ import annotations

import base64
import json

import pytest

from producer.protocol.messages import task_message


@pytest.fixture
def sent(redis_url: str):
    """What app.send_task LPUSHes for one task, read back from a private Redis DB."""
    from celery import Celery

    from tests.farmkit import private_db

    with private_db(redis_url) as url:
        import redis

        client = redis.Redis.from_url(url)
        app = Celery("check", broker=url, set_as_current=False)
        app.conf.update(task_serializer="json", accept_content=["json"], result_backend=None)
        app.send_task(
            "sandfarm.execute",
            args=[{"code": "print(1)"}, {"id": "j1"}],
            task_id="t/j1",
            queue="q-msg",
            argsrepr="job=j1",
            kwargsrepr="{}",
            soft_time_limit=90.0,
            time_limit=120.0,
            ignore_result=None,
        )
        yield json.loads(client.lrange("q-msg", 0, -1)[0])
        app.close()


def test_task_message_matches_send_task(sent: dict) -> None:
    mine = json.loads(
        task_message(
            "sandfarm.execute",
            "t/j1",
            [{"code": "print(1)"}, {"id": "j1"}],
            "q-msg",
            argsrepr="job=j1",
            time_limit=120.0,
            soft_time_limit=90.0,
        )
    )
    for field in ("delivery_tag", "reply_to"):  # per message / per client: never compared
        sent["properties"].pop(field)
        mine["properties"].pop(field)
    # send_task also copies options it does not know (argsrepr, kwargsrepr) into the
    # properties; the worker reads them from the headers only.
    assert sent["properties"].pop("argsrepr") == sent["headers"]["argsrepr"]
    assert sent["properties"].pop("kwargsrepr") == sent["headers"]["kwargsrepr"]
    sent["headers"].pop("origin")
    mine["headers"].pop("origin")
    # the same body, as text: kombu decodes base64 for "base64", passes "utf-8" through
    assert sent["properties"].pop("body_encoding") == "base64"
    assert mine["properties"].pop("body_encoding") == "utf-8"
    assert json.loads(base64.b64decode(sent.pop("body"))) == json.loads(mine.pop("body"))
    assert mine == sent
    assert list(mine) == list(sent) and list(mine["headers"]) == list(sent["headers"])


def test_each_message_has_its_own_delivery_tag() -> None:
    one, two = (json.loads(task_message("t", "x", [], "q", argsrepr="")) for _ in range(2))
    assert one["properties"]["delivery_tag"] != two["properties"]["delivery_tag"]


def test_text_beyond_ascii_is_carried_as_utf8_and_decodes_alike() -> None:
    text = 'h\u00e9llo \u2713 \U0001f600 "quoted" \\ \n\x01'
    raw = task_message("t", "x", [{"code": text}, {"id": "x"}], "q", argsrepr=text)
    assert text.split()[1] in raw  # UTF-8 as it is, not \u escapes (smaller in Redis)
    message = json.loads(raw)
    assert json.loads(message["body"])[0][0]["code"] == text
    assert message["headers"]["argsrepr"] == text


def test_a_lone_surrogate_that_got_past_validation_is_escaped_not_refused() -> None:
    raw = task_message("t", "x", [{"code": "a\ud800"}, {"id": "x"}], "q", argsrepr="")
    raw.encode("utf-8")  # valid UTF-8 to store and send
    assert json.loads(json.loads(raw)["body"])[0][0]["code"] == "a\ud800"
