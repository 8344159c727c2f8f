"""Begun jobs of workers that cannot give them back themselves, given back by others.

A whole host lost (power, network, kernel) takes its reaper with it: nothing gives its
begun jobs back (worker/giveback.py) but kombu's restore, after the visibility timeout
(65 min by default). Any other worker's reaper of its queue does, once the lost worker's
heartbeat has not moved for ``worker_lost_s`` (60 s by default, never less than its
staleness) by Redis's clock and through that reaper's own rounds, for the runs its
records name whatever their pid (another host's pids cannot be checked), then forgets
its heartbeat. A worker only cut off from Redis that long runs those jobs as well: at
least once, the second result counted as a duplicate, as after kombu's restore.

A host that reboots brings its worker back under the same name, often within that
minute, and its fresh heartbeat hid the old one's runs. Each worker process has an
instance id (worker/instance.py), in its heartbeat and its runs' records: once a
worker's own heartbeat has stood as its own for a heartbeat's staleness (another live
worker of the same name would have written its own meanwhile), its reaper gives back
the runs its name's earlier instances left, once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from producer.protocol import Heartbeat, Settings, margins
from producer.protocol.records import redis_clock
from worker.giveback import RunTest, give_back

# A lost worker's beat stays the same through at least this many of a reaper's rounds.
LOST_ROUNDS = 3

# Forget a lost worker's heartbeat only as read (it may have come back since).
_FORGET = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
return redis.call('HDEL', KEYS[1], ARGV[1])
"""


@dataclass
class LostWatch:
    """What this reaper saw of the heartbeats. A worker is lost only once its beat stayed
    the same through ``LOST_ROUNDS`` of this reaper's own rounds spanning
    ``worker_lost_s`` by this reaper's clock, as well as by Redis's: by Redis's clock
    alone, a reaper whose read waited out a Redis stall found every worker, itself
    included, lost, and their live jobs ran twice (a review). Cleared on a Redis error."""

    clock: Callable[[], float] = time.monotonic
    seen: dict[str, tuple[float, float, int]] = field(default_factory=dict)  # ts, since, rounds
    own_since: float | None = None  # since when its own beat has been its instance's
    own_rounds: int = 0
    predecessors_done: bool = False
    twin: bool = False  # another live worker has this name (set by the beat thread)

    def clear(self) -> None:
        self.seen.clear()
        self.own_since, self.own_rounds = None, 0

    def saw_twin(self, replaced: bytes | None, instance: str) -> bool:
        """Did the beat just written replace another instance's, which only a live worker
        of the same name writes between two of ours? True the first time."""
        if replaced is None or self.twin:
            return False
        try:
            other = Heartbeat.model_validate_json(replaced).instance
        except ValueError:
            return False
        self.twin = other != instance
        return self.twin


def run_of(worker: str) -> RunTest:
    """A run of ``worker``, wherever (another host's pids cannot be checked)."""
    return lambda record: record.worker == worker


def _beats(client: redis.Redis, settings: Settings) -> dict[str, tuple[bytes | str, Heartbeat]]:
    """The heartbeats of this queue's workers: name -> (as stored, parsed)."""
    found = {}
    for raw_name, raw in client.hgetall(settings.keys.workers).items():
        name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
        try:
            beat = Heartbeat.model_validate_json(raw)
        except ValueError:
            continue
        if settings.queue in beat.queues:  # another queue's worker holds none of ours
            found[name] = (raw, beat)
    return found


def give_back_lost(
    client: redis.Redis, settings: Settings, own: str, watch: LostWatch
) -> dict[str, int]:
    """Give back the begun jobs of each other worker of this queue whose heartbeat has
    not moved for ``worker_lost_s``, then forget it: lost worker -> how many."""
    lost: dict[str, int] = {}
    beats = _beats(client, settings)
    now, mono = redis_clock(client), watch.clock()  # heartbeats carry Redis's clock
    for name, (raw, beat) in beats.items():
        if name == own:
            continue
        ts, since, rounds = watch.seen.get(name, (None, mono, 0))
        if ts != beat.ts:
            watch.seen[name] = (beat.ts, mono, 1)
            continue
        watch.seen[name] = (ts, since, rounds + 1)
        after = max(settings.worker_lost_s, margins.heartbeat_stale_after(beat.interval_s))
        if rounds + 1 < LOST_ROUNDS or mono - since < after or now - beat.ts <= after:
            continue
        lost[name] = give_back(client, settings, run_of(name))
        client.eval(_FORGET, 1, settings.keys.workers, name, raw)
        del watch.seen[name]
    for name in set(watch.seen) - set(beats):
        del watch.seen[name]
    return lost


def give_back_predecessors(
    client: redis.Redis, settings: Settings, own: str, instance: str, watch: LostWatch
) -> int | None:
    """Once this worker's heartbeat has stood as its own instance's through
    ``LOST_ROUNDS`` rounds spanning its staleness, give back the runs earlier instances
    of its name left (a host rebooted): how many, None until then (and after)."""
    if watch.predecessors_done or watch.twin or not instance:
        return None
    found = _beats(client, settings).get(own)
    mono = watch.clock()
    if found is None or found[1].instance != instance:
        watch.own_since, watch.own_rounds = None, 0  # another of its name beats: wait
        return None
    if watch.own_since is None:
        watch.own_since = mono
    watch.own_rounds += 1
    stale = margins.heartbeat_stale_after(found[1].interval_s)
    if watch.own_rounds < LOST_ROUNDS or mono - watch.own_since < stale:
        return None
    given = give_back(
        client,
        settings,
        lambda record: record.worker == own and record.instance not in (None, instance),
    )
    watch.predecessors_done = True
    return given


def others_round(
    client: redis.Redis, settings: Settings, own: str, instance: str, watch: LostWatch
) -> list[str]:
    """One reaper round of the above: what to log."""
    try:
        lost = give_back_lost(client, settings, own, watch)
        earlier = give_back_predecessors(client, settings, own, instance, watch)
    except redis.RedisError:
        watch.clear()  # what it saw before an outage says nothing of after it
        return []
    lines = [
        f"{name} lost (its heartbeat stood still {settings.worker_lost_s:g} s);"
        f" {given} of its jobs sent again"
        for name, given in lost.items()
    ]
    if earlier:
        lines.append(f"{own}: {earlier} jobs its earlier instance began sent again")
    return lines
