"""The farm's counters in Redis: one hash (``Keys.stats``) the Lua scripts increment as
they store results, count attempts and refuse submissions, and the metrics collector
reads at scrape time.

Why in Redis and not in each worker process: a process's counters die with it (a
restart, a SIGKILLed pool child) and every replica would have to be scraped and summed;
the scripts already run once per event, atomically, so one HINCRBY there counts each
event exactly once for the whole farm.

Fields (``|`` separates labels; tenants and ids never contain it):
- ``jobs|<tenant>|<backend>|<status>``: stored results
- ``run|<backend>|<bucket>`` and ``run_sum|<backend>``: job run time (s), per bucket
- ``wait|<backend>|<bucket>`` and ``wait_sum|<backend>``: queue wait (s), per bucket
- ``redeliveries``: deliveries after the first (a worker died, a lost ack)
- ``chained``: jobs a slot took itself as it stored the last one's result (worker/chain.py)
- ``recovered``: dispatched messages found nowhere and pushed again (lib_dispatch.lua)
- ``orphaned``: results refused for a job record of other code, or none (lib_store.lua
  orphaned: Redis lost the job's data while it ran)
- ``refused|<tenant>|<reason>``: submissions refused at admission

Bound: tenants x backends x statuses + backends x buckets; the hash expires
``STATS_TTL_S`` after its last write (an idle farm's counters reset, as a restarted
process's would; Prometheus takes that as a counter reset).
"""

from __future__ import annotations

import bisect
import contextlib

import redis

from producer.protocol.keys import Keys

STATS_TTL_S = 30 * 86400
SEP = "|"
NO_BACKEND = "none"  # a job that ended before reaching a backend (cancelled, rejected)
# Upper bounds (s) of the run-time and queue-wait histograms: fixed, so every worker
# counts into the same buckets; each result adds 1 to the first bucket it fits.
BUCKETS_S: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
INF = "+Inf"


def bucket_of(seconds: float) -> str:
    """The label of the first bucket ``seconds`` fits in (``+Inf`` past the last)."""
    index = bisect.bisect_left(BUCKETS_S, seconds)
    return INF if index == len(BUCKETS_S) else repr(BUCKETS_S[index])


def field(*parts: str) -> str:
    return SEP.join(parts)


def split(name: str) -> list[str]:
    return name.split(SEP)


def count_refused(client: redis.Redis, keys: Keys, tenant: str, reason: str, jobs: int) -> None:
    """Count ``jobs`` refused before admission's script ran (a policy cap): one round
    trip, on the refusal path only. A count Redis refuses (full) is skipped: the refusal
    itself, not a 503, is the caller's answer."""
    pipe = client.pipeline(transaction=False)
    pipe.hincrby(keys.stats, field("refused", tenant, reason), jobs)
    pipe.expire(keys.stats, STATS_TTL_S)
    with contextlib.suppress(redis.exceptions.OutOfMemoryError):
        pipe.execute()
