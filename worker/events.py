"""What Flower and the worker log see of a job a chain ran after its message's own.

Celery reports a message's task (received, started, succeeded, its log line) itself; the
jobs a chain runs under that message (worker/chain.py) never pass through Celery's
consumer, so the worker reports them the same way: one line in the log, and Celery's
three task events in one message on the event exchange, as Celery 5.7's worker groups
them ("task.multi"), published by finish_job.lua once the job's result is stored.
tests/unit/test_task_events.py compares the message with one a real worker publishes.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any

from celery.app import trace
from celery.utils.time import utcoffset
from pydantic_core import to_json

EXCHANGE = "celeryev"
ROUTING_KEY = "task.multi"

_log = logging.getLogger(trace.__name__)
_offset: tuple[float, float] = (0.0, 0.0)  # (read at, hours): the zone changes seldom


def _utcoffset() -> float:
    global _offset
    now = time.monotonic()
    if now - _offset[0] > 60 or not _offset[0]:
        _offset = (now, utcoffset())
    return _offset[1]


def channel(db: int) -> str:
    """kombu's Redis fanout channel for the events (its keyprefix_fanout, exchange,
    routing key)."""
    return f"/{db}.{EXCHANGE}/{ROUTING_KEY}"


def task_events(
    *,
    hostname: str,
    qid: str,
    name: str,
    argsrepr: str,
    result: str,
    received: float,
    started: float,
    finished: float,
) -> str:
    """The kombu message carrying one job's task-received, -started and -succeeded."""
    base: dict[str, Any] = {
        "hostname": hostname,
        "utcoffset": _utcoffset(),
        "pid": os.getpid(),
        "clock": 0,  # no Lamport clock here: the timestamps order them
        "uuid": qid,
    }
    events = [
        {
            **base,
            "name": name,
            "args": argsrepr,
            "kwargs": "{}",
            "root_id": qid,
            "parent_id": None,
            "retries": 0,
            "eta": None,
            "expires": None,
            "timestamp": received,
            "type": "task-received",
        },
        {**base, "timestamp": started, "type": "task-started"},
        {
            **base,
            "result": repr(result),  # a summary: short and printable
            "runtime": finished - started,
            "timestamp": finished,
            "type": "task-succeeded",
        },
    ]
    message = {
        "body": to_json(events).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"hostname": hostname},
        "properties": {
            "delivery_mode": 1,
            "delivery_info": {"exchange": EXCHANGE, "routing_key": ROUTING_KEY},
            "priority": 0,
            "body_encoding": "utf-8",  # kombu passes it through (base64 elsewhere)
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    return to_json(message).decode()


def log_ran(qid: str, name: str, runtime: float, result: str) -> None:
    """The line Celery logs for a task it ran (trace.LOG_SUCCESS, as worker.app sets it)."""
    if _log.isEnabledFor(logging.INFO):
        fields = {"id": qid, "name": name, "runtime": runtime, "return_value": repr(result)}
        _log.info(trace.LOG_SUCCESS, fields)
