"""The task events a worker publishes for a job its chain ran (worker/events.py) are the
ones Celery's own event dispatcher publishes for a task, field by field, on the same
channel (read back from a real Redis with PSUBSCRIBE, as Flower receives them)."""

from __future__ import annotations

import base64
import json
import time

import pytest

from worker import events


@pytest.fixture
def published(redis_url: str):
    """What Celery's worker-side dispatcher (task events grouped) publishes for one
    task's received, started and succeeded events."""
    from celery import Celery

    from tests.farmkit import private_db

    with private_db(redis_url) as url:
        import redis

        client = redis.Redis.from_url(url)
        pubsub = client.pubsub()
        pubsub.psubscribe("/*.celeryev/*")
        pubsub.get_message(timeout=1)  # the subscription's confirmation
        app = Celery("check", broker=url, set_as_current=False)
        with app.connection_for_write() as conn:
            dispatcher = app.events.Dispatcher(
                conn, hostname="w@h", buffer_group=["task"], buffer_limit=3
            )
            fields = {"uuid": "t/j1"}
            dispatcher.send(
                "task-received",
                name="sandfarm.execute",
                args="job=j1",
                kwargs="{}",
                root_id="t/j1",
                parent_id=None,
                retries=0,
                eta=None,
                expires=None,
                **fields,
            )
            dispatcher.send("task-started", **fields)
            dispatcher.send("task-succeeded", result="'succeeded'", runtime=0.5, **fields)
            dispatcher.flush()
            dispatcher.close()
        deadline = time.monotonic() + 5
        message = None
        while message is None and time.monotonic() < deadline:
            got = pubsub.get_message(timeout=0.5)
            if got and got["type"] == "pmessage":
                message = got
        assert message is not None, "Celery published nothing"
        db = client.connection_pool.connection_kwargs.get("db") or 0
        yield message["channel"].decode(), json.loads(message["data"]), db
        pubsub.close()
        app.close()


def test_task_events_match_celerys(published) -> None:
    channel, theirs, db = published
    assert channel == events.channel(int(db))
    mine = json.loads(
        events.task_events(
            hostname="w@h",
            qid="t/j1",
            name="sandfarm.execute",
            argsrepr="job=j1",
            result="succeeded",
            received=1.0,
            started=2.0,
            finished=2.5,
        )
    )
    for message in (theirs, mine):
        message["properties"].pop("delivery_tag")  # per message: never compared
    assert theirs["properties"].pop("body_encoding") == "base64"
    assert mine["properties"].pop("body_encoding") == "utf-8"  # kombu passes it through
    their_events = json.loads(base64.b64decode(theirs.pop("body")))
    my_events = json.loads(mine.pop("body"))
    assert mine == theirs
    assert [e["type"] for e in my_events] == [e["type"] for e in their_events]
    for my_event, their_event in zip(my_events, their_events, strict=True):
        # the dispatcher's own values: its pid, Lamport clock and the event times
        for name in ("pid", "clock", "timestamp"):
            their_event.pop(name)
            my_event.pop(name)
        assert my_event == their_event
