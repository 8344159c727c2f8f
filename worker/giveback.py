"""A dead worker's messages, given back to its queue by its own reaper.

A worker whose main process is SIGKILLed (the OOM killer, `kill -9`, a crash) leaves the
messages it held in kombu's unacked hash: acks_late keeps them there until Celery acks
them, and only kombu's restore of messages older than the visibility timeout (65 min by
default) sends them again. Its jobs waited that long (a reliability review).

The reaper outlives its worker (its own session) to sweep the slots; once they are clean
no process of the worker's jobs is left, so it gives back each message whose job's
running record (``Keys.running``, or its chain's current job's) names this worker and a
pool process that is gone, and whose delivery is still the one that run began under
(its tag and score, kept in the record): put back at the head of its queue, as kombu's
own restore does, and removed from the unacked hash in the same step, so no other
restore sends it twice. Only in a round whose sweeps (the
slots, the worker's containers) all succeeded: a docker job's container outlives its
pool process until it is reaped. A message the worker held but had not begun names no
one: it waits for the visibility timeout, as before.

A whole host lost (its reaper with it), or a worker restarted under the same name, is
given back by other reapers, or by the new one's (worker/lostworkers.py), through
``give_back`` with a test of their own.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import redis
from kombu.utils.json import loads

from producer.protocol import KOMBU_UNACKED, KOMBU_UNACKED_INDEX, Settings
from producer.protocol.records import RunningRecord
from worker.kombu_fixes import compact_dumps

# Only for a record without a delivery tag (written by a worker of before stop 41, and
# gone once such workers are: a record lives its job's timeout + 120 s): the delivering
# host's clock (kombu's score) against Redis's (the run's start). A message delivered
# more than this after its run began is another delivery's.
DELIVERY_SKEW_S = 1.0

# Put back only the delivery read: a worker's ack or kombu's restore may have taken it
# since, and a later delivery of a message restored before writes the same entry (only
# its score tells them apart: an attack review).
_GIVE_BACK = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[4]) then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('RPUSH', KEYS[3], ARGV[3])
return 1
"""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


RunTest = Callable[[RunningRecord], bool]


def dead_here(worker: str, instance: str = "") -> RunTest:
    """A run of ``worker`` (of its ``instance``, when known), on this host, whose pool
    process is gone."""
    ours = (None, instance) if instance else None
    return lambda record: (
        record.worker == worker
        and (ours is None or record.instance in ours)
        and not pid_alive(record.pid)
    )


def _held_by_dead(
    client: redis.Redis, settings: Settings, qid: str, dead: RunTest, tag: str, delivered: float
) -> bool:
    """Is ``qid``'s message (or its chain's current job) run as ``dead`` says, under the
    delivery that stands (``tag``, and ``delivered``, its kombu unacked_index score)? A
    message requeued when the job's pool process died and delivered to another worker
    since still names the dead one until it begins there: given back then, it would run
    twice (a review). The run's record keeps its delivery's tag and score as the worker
    received them (worker/kombu_fixes.py), so no clock is compared: judged by time, a
    host whose clock ran over a second ahead of Redis's gave nothing back."""
    keys = settings.keys
    current = client.hget(keys.chain(qid), "q")
    for job in {qid, current.decode() if isinstance(current, bytes) else qid}:
        raw = client.get(keys.running(job))
        if raw is None:
            continue
        try:
            record = RunningRecord.model_validate_json(raw)
        except ValueError:
            continue
        if record.tag is not None:  # that delivery, or (no score known) none
            if (record.tag, record.delivered) != (tag, delivered):
                continue
        elif record.at is None or delivered > record.at + DELIVERY_SKEW_S:
            continue
        if dead(record):
            return True
    return False


def give_back(client: redis.Redis, settings: Settings, dead: RunTest) -> int:
    """Put back in its queue each message whose run ``dead`` says is over; how many."""
    given = 0
    for tag, entry in client.hscan_iter(KOMBU_UNACKED, count=1000):
        try:
            message, _exchange, routing_key = loads(entry)
            qid = message["headers"]["id"]
        except (ValueError, KeyError, TypeError):
            continue
        if routing_key != settings.queue or not isinstance(qid, str):
            continue
        delivered = client.zscore(KOMBU_UNACKED_INDEX, tag)
        name = tag.decode() if isinstance(tag, bytes) else str(tag)
        if delivered is None or not _held_by_dead(client, settings, qid, dead, name, delivered):
            continue
        message["headers"]["redelivered"] = True
        with_flag = compact_dumps(message)  # as the transport writes it (kombu_fixes 4.)
        keys = [KOMBU_UNACKED, KOMBU_UNACKED_INDEX, settings.queue]
        args = (tag, entry, with_flag, repr(delivered))
        given += int(client.eval(_GIVE_BACK, len(keys), *keys, *args))
    return given
