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
minute, and its fresh heartbeat hid the old one's runs. Each worker start has an
instance id (worker/instance.py), in its heartbeat and its runs' records: once a
worker's own heartbeat has stood as its own for ``worker_lost_s`` (and for the
staleness of any other beat of its name it replaced: another live worker of the name
would have written its own meanwhile), its reaper gives back the runs its name's
earlier instances left whose process is surely gone (another boot, or no process with
that pid and start time in its pid namespace: the old main process SIGKILLed, its pool
child may still be finishing its job, a review), once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from producer.protocol import Heartbeat, RunningRecord, Settings, margins
from producer.protocol.records import redis_clock
from sandbox_core.procid import is_gone
from worker.giveback import give_back, pid_alive

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
    interval: float = 5.0  # this reaper's: a longer gap between its looks starts afresh
    # name -> its beat's ts, since when seen so, in how many rounds, last looked at
    seen: dict[str, tuple[float, float, int, float]] = field(default_factory=dict)
    own_since: float | None = None  # since when its own beat has been its instance's
    own_rounds: int = 0
    own_last: float = 0.0
    predecessors_done: bool = False
    twin: bool = False  # another live worker has this name (set by the beat thread)
    others_stale_s: float = 0.0  # the staleness of other instances' beats it replaced

    def clear(self) -> None:
        self.seen.clear()
        self.own_since, self.own_rounds = None, 0

    def gap(self, last: float, now: float, interval_s: float) -> bool:
        """Were two looks too far apart to say the beat stood still between them? (This
        reaper paused with Redis, or its sweeps stalled: rounds counted back to back
        after the gap judged a live worker lost, a review.)"""
        return now - last > 2 * max(self.interval, interval_s) + 2

    def saw_twin(self, replaced: bytes | None, instance: str, first: bool) -> bool:
        """Did the beat just written replace another instance's? After its first beat
        only a live worker of the same name writes one between two of ours: True then,
        the first time."""
        if replaced is None:
            return False
        try:
            other = Heartbeat.model_validate_json(replaced)
        except ValueError:
            return False
        if other.instance == instance:
            return False
        stale = margins.heartbeat_stale_after(other.interval_s)
        self.others_stale_s = max(self.others_stale_s, stale)
        if first or self.twin:
            return False
        self.twin = True
        return True


Beats = dict[str, tuple[bytes | str, Heartbeat]]  # name -> (as stored, parsed)


def _beats(client: redis.Redis, settings: Settings) -> Beats:
    """The heartbeats of this queue's workers: name -> (as stored, parsed)."""
    found: Beats = {}
    for raw_name, raw in client.hgetall(settings.keys.workers).items():
        name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
        try:
            beat = Heartbeat.model_validate_json(raw)
        except ValueError:
            continue
        if settings.queue in beat.queues:  # another queue's worker holds none of ours
            found[name] = (raw, beat)
    return found


def lost_workers(
    beats: Beats, settings: Settings, own: str, watch: LostWatch, now: float
) -> list[str]:
    """The other workers whose heartbeat has not moved for ``worker_lost_s``."""
    lost = []
    mono = watch.clock()
    for name, (_raw, beat) in beats.items():
        if name == own:
            continue
        ts, since, rounds, last = watch.seen.get(name, (None, mono, 0, mono))
        if ts != beat.ts or watch.gap(last, mono, beat.interval_s):
            watch.seen[name] = (beat.ts, mono, 1, mono)
            continue
        watch.seen[name] = (ts, since, rounds + 1, mono)
        after = max(settings.worker_lost_s, margins.heartbeat_stale_after(beat.interval_s))
        if rounds + 1 >= LOST_ROUNDS and mono - since >= after and now - beat.ts > after:
            lost.append(name)
    for name in set(watch.seen) - set(beats):
        del watch.seen[name]
    return lost


def predecessors_due(
    beats: Beats, settings: Settings, own: str, instance: str, watch: LostWatch
) -> bool:
    """Has this worker's own beat stood as its instance's long enough to give back what
    earlier instances of its name left (once)?"""
    if watch.predecessors_done or watch.twin or not instance:
        return False
    found = beats.get(own)
    mono = watch.clock()
    if found is None or found[1].instance != instance:
        watch.own_since, watch.own_rounds = None, 0  # another of its name beats: wait
        return False
    if watch.own_since is None or watch.gap(watch.own_last, mono, found[1].interval_s):
        watch.own_since, watch.own_rounds = mono, 0
    watch.own_rounds += 1
    watch.own_last = mono
    wait = max(
        settings.worker_lost_s,
        margins.heartbeat_stale_after(found[1].interval_s),
        watch.others_stale_s,
    )
    return watch.own_rounds >= LOST_ROUNDS and mono - watch.own_since >= wait


def _earlier_instances_run(own: str, instance: str) -> Callable[[RunningRecord], bool]:
    def over(record: RunningRecord) -> bool:
        if record.worker != own or record.instance in (None, instance):
            return False
        if record.process:
            return is_gone(record.pid, record.process)
        return not pid_alive(record.pid)

    return over


def others_round(
    client: redis.Redis, settings: Settings, own: str, instance: str, watch: LostWatch
) -> list[str]:
    """One reaper round: give back what lost workers, and this worker's earlier
    instances, began; what to log. Each message goes back once (giveback.py)."""
    try:
        beats = _beats(client, settings)
        lost = lost_workers(beats, settings, own, watch, redis_clock(client))
        earlier = predecessors_due(beats, settings, own, instance, watch)
        lines = []
        if lost:
            # only the instance judged lost: one started under its name since is not
            instances = {name: (None, beats[name][1].instance or None) for name in lost}
            given = give_back(
                client,
                settings,
                lambda record: (
                    record.worker in instances and record.instance in instances[record.worker]
                ),
            )
            for name in lost:
                client.eval(_FORGET, 1, settings.keys.workers, name, beats[name][0])
                del watch.seen[name]
            lines.append(
                f"{', '.join(sorted(lost))} lost (heartbeat still past"
                f" SANDFARM_WORKER_LOST_S); {given} of their jobs sent again"
            )
        if earlier:
            given = give_back(client, settings, _earlier_instances_run(own, instance))
            watch.predecessors_done = True
            lines.append(f"{own}: {given} jobs its earlier instance began sent again")
        return lines
    except redis.RedisError:
        watch.clear()  # what it saw before an outage says nothing of after it
        return []
