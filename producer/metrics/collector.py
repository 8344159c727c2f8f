"""The farm's Prometheus series, computed from Redis at scrape time.

One collector for the whole farm, not a ``/metrics`` per worker: the state (queues,
heartbeats, in-flight jobs) is in Redis already, and the counters are kept there by the
Lua scripts (protocol.stats), so nothing is lost when a worker restarts and nothing is
counted twice across replicas. A scrape is two pipelined round trips.

Labels are bounded: tenants are those of the tenant store (plus the trusted client's
and ``none``), backends and statuses are fixed sets, workers are the fresh-enough
heartbeats; never a job id.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import redis
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from producer.protocol import KOMBU_UNACKED, Heartbeat, Settings, margins, stats
from producer.protocol.records import redis_clock
from producer.protocol.tenant_store import text

# kombu's Redis transport keeps priorities 3, 6 and 9 in lists of their own
# (queue + "\x06\x16" + priority): counting only the plain list undercounts them.
PRIORITY_SEP = "\x06\x16"
PRIORITY_STEPS = (3, 6, 9)
WORKER_SHOWN_S = 3600.0  # beats older than this are left out (a worker long gone)


@dataclass
class Snapshot:
    """What one scrape read from Redis."""

    queued: int = 0
    unacked: int = 0
    tenants: list[str] = field(default_factory=list)
    pending: dict[str, int] = field(default_factory=dict)
    dispatched: dict[str, int] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)
    beats: dict[str, Heartbeat] = field(default_factory=dict)
    duplicates: int = 0
    counters: dict[str, str] = field(default_factory=dict)
    now: float = 0.0
    beat_now: float = 0.0  # Redis's clock, which heartbeats are stamped with


def read(client: redis.Redis, settings: Settings) -> Snapshot:
    keys, queue = settings.keys, settings.queue
    now = time.time()
    beat_now = redis_clock(client)  # heartbeats are stamped with Redis's clock
    pipe = client.pipeline(transaction=False)
    for name in (queue, *(f"{queue}{PRIORITY_SEP}{p}" for p in PRIORITY_STEPS)):
        pipe.llen(name)
    pipe.hlen(KOMBU_UNACKED)
    pipe.smembers(keys.tenants)
    pipe.smembers(keys.ready)
    pipe.hgetall(keys.workers)
    pipe.zrangebyscore(keys.in_flight, now, "+inf")
    pipe.get(keys.duplicates)
    pipe.hgetall(keys.stats)
    *lengths, unacked, tenants, ready, beats, flying, duplicates, counters = pipe.execute()
    names = {text(t) for t in tenants} | {text(t) for t in ready} | {settings.client_tenant}
    snap = Snapshot(
        queued=sum(lengths),
        unacked=unacked,
        tenants=sorted(names),
        duplicates=int(duplicates or 0),
        counters={text(k): text(v) for k, v in counters.items()},
        now=now,
        beat_now=beat_now,
    )
    for raw_name, raw in beats.items():
        try:
            beat = Heartbeat.model_validate_json(raw)
        except ValueError:
            continue  # not a beat of ours: a scrape never fails for one field
        if beat_now - beat.ts <= WORKER_SHOWN_S:
            snap.beats[text(raw_name)] = beat
    for qid in flying:
        tenant, sep, _ = text(qid).partition("/")
        who = tenant if sep else stats.NO_BACKEND
        snap.running[who] = snap.running.get(who, 0) + 1
    pipe = client.pipeline(transaction=False)
    for name in snap.tenants:
        pipe.llen(keys.pending(name))
        pipe.zcount(keys.active(name), now, "+inf")
    counts = pipe.execute()
    for i, name in enumerate(snap.tenants):
        snap.pending[name] = counts[2 * i]
        snap.dispatched[name] = counts[2 * i + 1]
    return snap


def _gauge(name: str, doc: str, labels: list[str], values: Mapping[str, float]) -> Metric:
    family = GaugeMetricFamily(f"sandfarm_{name}", doc, labels=labels)
    for label, value in sorted(values.items()):
        family.add_metric([label], value)
    return family


def state_families(snap: Snapshot, queue: str) -> Iterator[Metric]:
    t = ["tenant"]
    yield _gauge("jobs_pending", "Jobs waiting in a tenant's fair-share queue", t, snap.pending)
    yield _gauge(
        "jobs_dispatched", "Jobs moved to the Celery queue, not final yet", t, snap.dispatched
    )
    running = {name: float(snap.running.get(name, 0)) for name in snap.tenants}
    yield _gauge("jobs_running", "Jobs a sandbox runs now", t, running)
    yield _gauge(
        "celery_queue_length",
        "Messages in the Celery queue (all priorities)",
        ["queue"],
        {queue: snap.queued},
    )
    yield GaugeMetricFamily(
        "sandfarm_celery_unacked", "Delivered, unacknowledged messages", value=snap.unacked
    )
    fresh = {
        name: beat
        for name, beat in snap.beats.items()
        if snap.beat_now - beat.ts <= margins.heartbeat_stale_after(beat.interval_s)
    }
    yield GaugeMetricFamily("sandfarm_workers_online", "Workers beating", value=len(fresh))
    w = ["worker"]
    ages = {name: max(0.0, snap.beat_now - beat.ts) for name, beat in snap.beats.items()}
    yield _gauge("worker_heartbeat_age_seconds", "Seconds since a worker's last beat", w, ages)
    slots = {name: float(beat.concurrency) for name, beat in fresh.items()}
    yield _gauge("worker_slots", "Sandbox slots of an online worker", w, slots)
    total, busy = sum(slots.values()), sum(snap.running.values())
    yield GaugeMetricFamily("sandfarm_slots", "Sandbox slots of online workers", value=total)
    yield GaugeMetricFamily("sandfarm_slots_busy", "Slots running a job", value=busy)
    yield GaugeMetricFamily(
        "sandfarm_slot_utilisation",
        "Busy slots / slots (0 without workers)",
        value=busy / total if total else 0.0,
    )


def counter_families(snap: Snapshot) -> Iterator[Metric]:
    known = {*snap.tenants, stats.NO_BACKEND}
    jobs = CounterMetricFamily(
        "sandfarm_jobs", "Jobs ended, by status", labels=["tenant", "backend", "status"]
    )
    refused = CounterMetricFamily(
        "sandfarm_admission_refused", "Jobs refused at admission", labels=["tenant", "reason"]
    )
    buckets: dict[str, dict[str, dict[str, int]]] = {
        "run": defaultdict(dict),
        "wait": defaultdict(dict),
    }
    sums: dict[str, dict[str, float]] = {"run": {}, "wait": {}}
    redeliveries = recovered = chained = orphaned = 0
    for name, raw in sorted(snap.counters.items()):
        parts = stats.split(name)
        kind = parts[0]
        if kind == "jobs" and len(parts) == 4 and parts[1] in known:
            jobs.add_metric(parts[1:], float(raw))
        elif kind == "refused" and len(parts) == 3 and parts[1] in known:
            refused.add_metric(parts[1:], float(raw))
        elif kind in ("run", "wait") and len(parts) == 3:
            buckets[kind][parts[1]][parts[2]] = int(raw)
        elif kind in ("run_sum", "wait_sum") and len(parts) == 2:
            sums[kind[:-4]][parts[1]] = float(raw)
        elif kind == "redeliveries":
            redeliveries = int(raw)
        elif kind == "recovered":
            recovered = int(raw)
        elif kind == "chained":
            chained = int(raw)
        elif kind == "orphaned":
            orphaned = int(raw)
    yield jobs
    yield refused
    yield CounterMetricFamily(
        "sandfarm_redeliveries", "Deliveries of a job after its first", value=redeliveries
    )
    yield CounterMetricFamily(
        "sandfarm_recovered_deliveries",
        "Dispatched messages Redis lost (in no queue, not delivered), pushed again",
        value=recovered,
    )
    yield CounterMetricFamily(
        "sandfarm_chained_jobs",
        "Jobs a slot took itself as it stored the last one's result (no Celery message)",
        value=chained,
    )
    yield CounterMetricFamily(
        "sandfarm_orphaned_results",
        "Results refused: their job's record names other code, or is gone",
        value=orphaned,
    )
    yield CounterMetricFamily(
        "sandfarm_duplicate_results",
        "Second results of a job, refused (never stored)",
        value=snap.duplicates,
    )
    for kind, doc in (("run", "Job run time"), ("wait", "Job queue wait")):
        name = "sandfarm_job_run_seconds" if kind == "run" else "sandfarm_job_queue_wait_seconds"
        family = HistogramMetricFamily(name, f"{doc} (s), by backend", labels=["backend"])
        for backend, counts in sorted(buckets[kind].items()):
            family.add_metric(
                [backend], _cumulative(counts), sum_value=sums[kind].get(backend, 0.0)
            )
        yield family


def _cumulative(counts: dict[str, int]) -> list[tuple[str, float]]:
    total, out = 0, []
    for bound in (*(repr(b) for b in stats.BUCKETS_S), stats.INF):
        total += counts.get(bound, 0)
        out.append((bound, float(total)))
    return out


class FarmCollector(Collector):
    """A prometheus_client collector: every series from one read of Redis."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.client = client
        self.settings = settings

    def collect(self) -> Iterator[Metric]:
        try:
            snap = read(self.client, self.settings)
        except redis.RedisError:
            yield GaugeMetricFamily("sandfarm_redis_up", "The farm's Redis answers", value=0)
            return
        yield GaugeMetricFamily("sandfarm_redis_up", "The farm's Redis answers", value=1)
        yield from state_families(snap, self.settings.queue)
        yield from counter_families(snap)
