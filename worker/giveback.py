"""A dead worker's messages, given back to its queue by its own reaper.

A worker whose main process is SIGKILLed (the OOM killer, `kill -9`, a crash) leaves the
messages it held in kombu's unacked hash: acks_late keeps them there until Celery acks
them, and only kombu's restore of messages older than the visibility timeout (65 min by
default) sends them again. Its jobs waited that long (a reliability review).

The reaper outlives its worker (its own session) to sweep the slots; once they are clean
no process of the worker's jobs is left, so it gives back each message whose job's
running record (``Keys.running``, or its chain's current job's) names this worker and a
pool process that is gone, and whose delivery came before that run began: put back at
the head of its queue, as kombu's own restore does, and removed from the unacked hash in
the same step, so no other restore sends it twice. Only in a round whose sweeps (the
slots, the worker's containers) all succeeded: a docker job's container outlives its
pool process until it is reaped. A message the worker held but had not begun names no
one: it waits for the visibility timeout, as before.

A whole host lost (its reaper with it) gives nothing back itself: any other worker's
reaper of its queue does, once the lost worker's heartbeat has not moved for
``worker_lost_s`` (60 s by default, never less than its staleness) by Redis's clock and by
that reaper's own rounds (LostWatch), for the runs its records name whatever their
pid (another host's pids cannot be checked), then forgets its heartbeat. A worker only
cut off from Redis that long runs those jobs as well: at least once, the second result
counted as a duplicate, as kombu's own restore would after the visibility timeout.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from kombu.utils.json import dumps, loads

from producer.protocol import KOMBU_UNACKED, Heartbeat, Settings, margins
from producer.protocol.records import RunningRecord, redis_clock

# kombu's default ``unacked_index_key``: the delivery time of each unacked tag
KOMBU_UNACKED_INDEX = "unacked_index"
# The delivering host's clock (kombu's score) against Redis's (the run's start): a
# message delivered more than this after its run began is another delivery's.
DELIVERY_SKEW_S = 1.0
# A lost worker's beat stays the same through at least this many of a reaper's rounds.
LOST_ROUNDS = 3

# Put back only the entry read (a worker's ack or kombu's restore may have taken it since).
_GIVE_BACK = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('RPUSH', KEYS[3], ARGV[3])
return 1
"""

# Forget a lost worker's heartbeat only as read (it may have come back since).
_FORGET = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
return redis.call('HDEL', KEYS[1], ARGV[1])
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _held_by_dead(
    client: redis.Redis,
    settings: Settings,
    qid: str,
    worker: str,
    delivered: float,
    check_pid: bool,
) -> bool:
    """Is ``qid``'s message (or its chain's current job) run by ``worker``, in a pool
    process that is gone (when ``check_pid``: on this host), and was it delivered (at
    ``delivered``, kombu's unacked_index score) before that run began? A message
    requeued when the job's pool process died and delivered to another worker since
    still names the dead one until it begins there: given back then, it would run twice
    (a review)."""
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
        began = record.at
        if began is None or delivered > began + DELIVERY_SKEW_S:
            continue
        if record.worker == worker and not (check_pid and _alive(record.pid)):
            return True
    return False


def give_back(client: redis.Redis, settings: Settings, worker: str, check_pid: bool = True) -> int:
    """Put the messages dead ``worker`` held back in its queue; returns how many.
    ``check_pid``: the worker was on this host (its runs' pool processes are looked at)."""
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
        if delivered is None or not _held_by_dead(
            client, settings, qid, worker, delivered, check_pid
        ):
            continue
        message["headers"]["redelivered"] = True
        with_flag = dumps(message)
        keys = [KOMBU_UNACKED, KOMBU_UNACKED_INDEX, settings.queue]
        given += int(client.eval(_GIVE_BACK, len(keys), *keys, tag, entry, with_flag))
    return given


@dataclass
class LostWatch:
    """What this reaper saw of the other workers' heartbeats. A worker is lost only once
    its beat stayed the same through ``LOST_ROUNDS`` of this reaper's own rounds spanning
    ``worker_lost_s`` by this reaper's clock, as well as by Redis's: by Redis's clock
    alone, a reaper whose read waited out a Redis stall found every worker, itself
    included, lost, and their live jobs ran twice (a review). Cleared on a Redis error."""

    clock: Callable[[], float] = time.monotonic
    seen: dict[str, tuple[float, float, int]] = field(default_factory=dict)  # ts, since, rounds


def give_back_lost(
    client: redis.Redis, settings: Settings, own: str, watch: LostWatch
) -> dict[str, int]:
    """Give back the begun jobs of each other worker of this queue whose heartbeat has
    not moved for ``worker_lost_s`` (its host lost with its reaper), then forget it:
    lost worker -> how many. Any live worker's reaper runs it; each message goes back
    once."""
    lost: dict[str, int] = {}
    beats = client.hgetall(settings.keys.workers)
    now, mono = redis_clock(client), watch.clock()  # heartbeats carry Redis's clock
    present = set()
    for raw_name, raw in beats.items():
        name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
        try:
            beat = Heartbeat.model_validate_json(raw)
        except ValueError:
            continue
        if name == own or settings.queue not in beat.queues:
            continue  # another queue's worker holds none of this queue's messages
        present.add(name)
        ts, since, rounds = watch.seen.get(name, (None, mono, 0))
        if ts != beat.ts:
            watch.seen[name] = (beat.ts, mono, 1)
            continue
        watch.seen[name] = (ts, since, rounds + 1)
        after = max(settings.worker_lost_s, margins.heartbeat_stale_after(beat.interval_s))
        if rounds + 1 < LOST_ROUNDS or mono - since < after or now - beat.ts <= after:
            continue
        lost[name] = give_back(client, settings, name, check_pid=False)
        client.eval(_FORGET, 1, settings.keys.workers, name, raw)
        del watch.seen[name]
    for name in set(watch.seen) - present:
        del watch.seen[name]
    return lost
