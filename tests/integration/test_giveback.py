"""What a dead worker's reaper gives back (worker/giveback.py), against a real Redis: the
running record as begin_attempt.lua writes it, kombu's unacked hash and index as kombu
writes them. The end-to-end case (a SIGKILLed worker's job runs again at once) is
tests/faults/test_farm_faults.py."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from kombu.utils.json import dumps

from producer.protocol import (
    KOMBU_UNACKED,
    KOMBU_UNACKED_INDEX,
    Heartbeat,
    RunningRecord,
    Settings,
    connect,
)
from producer.protocol.records import redis_clock
from producer.protocol.scripts import FarmScripts
from sandbox_core.procid import boot_id, identity, pid_namespace
from tests.farmkit import private_db
from worker.giveback import dead_here, give_back
from worker.lostworkers import LostWatch, others_round, predecessors_due


def _unacked(r, settings: Settings, qid: str, tag: str, delivered: float) -> None:
    message = {"headers": {"id": qid, "task": "sandfarm.execute"}, "body": "[]"}
    r.hset(KOMBU_UNACKED, tag, dumps([message, "", settings.queue]))
    r.zadd(KOMBU_UNACKED_INDEX, {tag: delivered})


@contextmanager
def _farm(
    redis_url: str, **settings: object
) -> Iterator[tuple[Settings, redis.Redis, FarmScripts]]:
    """A private DB with a farm's own queue and prefix: its settings, client and scripts."""
    with private_db(redis_url) as url:
        tag = uuid.uuid4().hex[:6]
        values: dict = {"queue": f"q-{tag}", "key_prefix": f"f-{tag}:", **settings}
        farm = Settings(redis_url=url, **values)
        r = connect(url)
        yield farm, r, FarmScripts(r, farm)


def test_only_a_message_its_dead_run_was_delivered_by_is_given_back(redis_url: str) -> None:
    with _farm(redis_url) as (settings, r, scripts):
        dead_pid = 2**22 + 7  # above any pid_max: never alive
        for qid in ("ran-here", "sent-on"):
            running = RunningRecord(worker="w1@host", pid=dead_pid, slot=0)
            assert scripts.begin_attempt(qid, running, 30, uuid.uuid4().hex) is not None
        began = RunningRecord.model_validate_json(r.get(settings.keys.running("ran-here"))).at
        assert began is not None and abs(began - time.time()) < 5  # stamped by Redis
        # delivered to w1, then begun there: its run died with w1
        _unacked(r, settings, "ran-here", "t1", began - 0.01)
        # its pool process died and it was delivered again, to a live worker that has
        # not begun it: still named by w1's record, but not w1's to give back
        _unacked(r, settings, "sent-on", "t2", began + 30)
        assert give_back(r, settings, dead_here("w1@host")) == 1
        assert r.lrange(settings.queue, 0, -1) and not r.hexists(KOMBU_UNACKED, "t1")
        assert r.hexists(KOMBU_UNACKED, "t2")  # left with its holder
        # a live pool process's run, or another worker's, is never given back
        _unacked(r, settings, "ran-here", "t3", began - 0.01)
        assert give_back(r, settings, dead_here("w2@host")) == 0
        r.set(
            settings.keys.running("ran-here"),
            RunningRecord(worker="w1@host", pid=os.getpid(), slot=0, at=began).dump(),
        )
        assert give_back(r, settings, dead_here("w1@host")) == 0


def test_a_run_is_matched_to_its_delivery_by_its_tag_and_score_not_by_clocks(
    redis_url: str,
) -> None:
    """kombu stamps a delivery with its host's clock, a run begins by Redis's: judged by
    comparing them, a host whose clock ran over a second ahead gave nothing back. A run's
    record keeps its delivery's tag and score as the worker received them
    (kombu_fixes.py), and a message goes back only while that very delivery stands."""
    with _farm(redis_url) as (settings, r, scripts):
        dead_pid = 2**22 + 7  # above any pid_max: never alive
        ahead = redis_clock(r) + 3600  # the delivering host's clock, an hour ahead

        def begin(qid: str, tag: str, delivered: float | None) -> None:
            running = RunningRecord(
                worker="w1@host", pid=dead_pid, slot=0, tag=tag, delivered=delivered
            )
            assert scripts.begin_attempt(qid, running, 30, uuid.uuid4().hex) is not None

        for qid in ("ran-here", "sent-on", "raced"):
            _unacked(r, settings, qid, f"tag-{qid}", ahead)
            begin(qid, f"tag-{qid}", ahead)
        # a record with a tag but no score (its worker was handed none) matches no
        # delivery, even one that by the clocks came just before it began
        begin("no-score", "tag-no-score", None)
        _unacked(r, settings, "no-score", "tag-no-score", redis_clock(r) - 0.5)
        began = RunningRecord.model_validate_json(r.get(settings.keys.running("ran-here"))).at
        assert began is not None and ahead - began > 3000  # judged by time: not its delivery
        # its pool process died and it was delivered again (by a host whose clock is
        # behind): not w1's to give back
        r.zadd(KOMBU_UNACKED_INDEX, {"tag-sent-on": ahead - 7200})

        def dead_and_raced(record: RunningRecord) -> bool:
            # kombu restores "raced" and delivers it again after its score was read: the
            # same entry, another score (an attack review)
            if record.tag == "tag-raced":
                r.zadd(KOMBU_UNACKED_INDEX, {"tag-raced": ahead + 1})
            return dead_here("w1@host")(record)

        assert give_back(r, settings, dead_and_raced) == 1
        assert not r.hexists(KOMBU_UNACKED, "tag-ran-here")
        for left in ("tag-sent-on", "tag-raced", "tag-no-score"):  # with their holders
            assert r.hexists(KOMBU_UNACKED, left) and r.zscore(KOMBU_UNACKED_INDEX, left)
        assert r.llen(settings.queue) == 1


def _heartbeat(settings: Settings, ts: float, **fields: object) -> str:
    values: dict = {"queues": (settings.queue,), **fields}
    return Heartbeat(
        pid=1, host="h", slots=(0, 1), uids=(None, None), concurrency=1, ts=ts, **values
    ).dump()


def test_a_lost_workers_runs_go_back_once_its_heartbeat_stood_still_and_it_is_forgotten(
    redis_url: str,
) -> None:
    """Its host lost with its reaper, a worker gives nothing back itself: any live
    reaper of its queue does (others_round), once its heartbeat has not moved for
    worker_lost_s by Redis's clock and through the reaper's own rounds, whatever its
    runs' pids (another host's: one alive here proves nothing of it)."""
    with _farm(redis_url, worker_lost_s=30) as (settings, r, scripts):
        now = redis_clock(r)
        jobs = (
            ("far@other", None, "far-job", "t1"),
            ("near@here", None, "near-job", "t2"),
            # begun by a worker started under the lost one's name since: not the lost one's
            ("far@other", "a-new-start", "far-new", "t5"),
        )
        for worker, instance, qid, tag_ in jobs:
            running = RunningRecord(worker=worker, pid=os.getpid(), slot=0, instance=instance)
            assert scripts.begin_attempt(qid, running, 30, uuid.uuid4().hex) is not None
            _unacked(r, settings, qid, tag_, now - 0.5)

        def beat(worker: str, age: float, queue: str = settings.queue) -> None:
            record = _heartbeat(settings, now - age, queues=(queue,))
            r.hset(settings.keys.workers, worker, record)

        clock = [0.0]
        watch = LostWatch(clock=lambda: clock[0], interval=5)

        def round_at(t: float, own: str = "judge@here") -> list[str]:
            clock[0] = t
            return others_round(r, settings, own, "", watch)

        beat("far@other", 31)  # older than worker_lost_s by Redis's clock ...
        beat("near@here", 1)
        # ... but this reaper has not seen it stand still that long: a reaper whose read
        # waited out a Redis stall saw every beat that old (a review)
        assert all(round_at(t) == [] for t in (0, 10, 20, 29))
        # nor across a gap in its own looks (it was paused with Redis, say): afresh
        assert round_at(50) == [] and round_at(60) == []
        beat("far@other", 31.5)  # it moved: watched afresh
        assert round_at(61) == [] and round_at(70) == []
        assert r.llen(settings.queue) == 0 and r.hlen(settings.keys.workers) == 2
        assert round_at(71, own="far@other") == []  # never itself
        beat("far@other", 31.5, queue="other")  # another queue's worker: not judged here
        assert round_at(72) == []
        beat("far@other", 31.5)
        assert all(round_at(t) == [] for t in (73, 83, 93, 102))
        (line,) = round_at(104)  # rounds, 31 s still by its clock and by Redis's
        assert line.startswith("far@other lost") and "1 of their jobs sent again" in line
        assert r.llen(settings.queue) == 1 and not r.hexists(KOMBU_UNACKED, "t1")
        assert r.hexists(KOMBU_UNACKED, "t2")  # the live worker's run stays its own
        assert r.hexists(KOMBU_UNACKED, "t5")  # so does the new start's
        assert r.hkeys(settings.keys.workers) == [b"near@here"]  # the lost one forgotten
        assert round_at(200) == []  # once


def test_a_workers_new_instance_gives_back_what_its_predecessor_began_once_sure(
    redis_url: str,
) -> None:
    """A rebooted host's worker comes back under the same name, often within
    worker_lost_s: its fresh heartbeat hid its predecessor's runs, which waited for the
    visibility timeout. Once its own beat has stood as its instance's for worker_lost_s
    (a live twin of the name would have written its own), it gives back those whose
    process is gone, once. Its own runs, runs of no instance, and a run whose pool
    process still lives here (the old main process killed, its child finishing: a
    review) stay."""
    with _farm(redis_url, worker_lost_s=20) as (settings, r, scripts):
        now = redis_clock(r)
        me = os.getpid()
        runs = (
            ("old", identity(me).replace(boot_id(), "another-boot"), "t1"),  # rebooted
            ("old", identity(me), "t4"),  # its pool process still runs here
            # of another pid namespace (a worker in a container): not known gone
            ("old", identity(me).replace(pid_namespace(), "pid:[1]"), "t5"),
            ("new", identity(me), "t2"),
            (None, None, "t3"),
        )
        for instance, process, tag_ in runs:
            running = RunningRecord(
                worker="w@h", pid=me, slot=0, instance=instance, process=process
            )
            assert scripts.begin_attempt(tag_, running, 30, uuid.uuid4().hex) is not None
            _unacked(r, settings, tag_, tag_, now - 0.5)

        def beat(instance: str) -> None:
            r.hset(settings.keys.workers, "w@h", _heartbeat(settings, now, instance=instance))

        clock = [0.0]
        watch = LostWatch(clock=lambda: clock[0])

        def round_at(t: float) -> list[str]:
            clock[0] = t
            return others_round(r, settings, "w@h", "new", watch)

        beat("old")  # the predecessor's beat still stands: not yet
        assert round_at(0) == [] and round_at(5) == []
        beat("new")
        assert round_at(6) == [] and round_at(11) == [] and round_at(16) == []
        beat("other")  # a twin wrote its own meanwhile: watched afresh
        assert round_at(20) == []
        beat("new")
        assert round_at(21) == [] and round_at(31) == [] and round_at(40) == []
        assert r.llen(settings.queue) == 0
        assert round_at(41) == ["w@h: 1 jobs its earlier instance began sent again"]
        assert not r.hexists(KOMBU_UNACKED, "t1")
        assert all(r.hexists(KOMBU_UNACKED, t) for t in ("t2", "t3", "t4", "t5"))
        assert round_at(60) == []  # once


def test_a_live_twin_of_the_name_switches_the_give_back_off() -> None:
    """Only a live worker of the same name writes its beat between two of ours: from
    then on, neither gives back what the other began. The first beat may replace a dead
    predecessor's: its staleness lengthens the wait, it is no twin."""
    settings = Settings(worker_lost_s=1)
    old = Heartbeat(pid=1, host="h", slots=(0, 1), uids=(None, None), concurrency=1)

    def written(instance: str, interval_s: float = 5) -> bytes:
        return (
            old.model_copy(update={"instance": instance, "interval_s": interval_s}).dump().encode()
        )

    watch = LostWatch()
    assert not watch.saw_twin(None, "new", first=True)
    assert not watch.saw_twin(written("gone", interval_s=60), "new", first=True)
    assert watch.others_stale_s == 3 * 60 + 2  # a slow beat: waited for as long
    assert not watch.saw_twin(written("new"), "new", first=False)
    assert watch.saw_twin(written("twin"), "new", first=False)
    beats = {"w@h": (b"", old.model_copy(update={"instance": "new"}))}
    assert not predecessors_due(beats, settings, "w@h", "new", watch)
