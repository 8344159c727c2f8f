"""Every time margin of the farm contract, each with its reason. All in seconds."""

from __future__ import annotations

from producer.protocol.connection import RETRIES, RETRY_CAP_S, SOCKET_TIMEOUT_S
from sandbox_core import defaults as d

# The longest job the farm accepts (its wall clock, all steps together).
LONGEST_JOB_S = d.TIMEOUT_S[1]

# Added to the longest job for the broker's visibility timeout, so the message of a job
# that still runs is never taken for lost: slot wait + workspace setup + storing fit.
VISIBILITY_MARGIN_S = 300.0

# Celery's own per-task limits sit above the sandbox's deadline, which kills its whole
# tree; Celery's limits only catch a farm hang (the soft one first, then the hard one).
SOFT_LIMIT_MARGIN_S = 60.0
HARD_LIMIT_MARGIN_S = 90.0

# A chain (worker/chain.py) takes a job only if the job's deadline falls this long before
# the soft time limit and the visibility timeout of the message it runs under: the job's
# slot wait, setup, the sandbox's kill and the result's store fit (a job of its own has
# SOFT_LIMIT_MARGIN_S), and the message is never redelivered (nor the job stopped by
# Celery) while its chain is alive. A default job (30 s) still fits after a default one.
CHAIN_SLACK_S = 30.0

# The worker-wide hard limit: above the longest job, below the visibility timeout.
WORKER_HARD_LIMIT_S = LONGEST_JOB_S + VISIBILITY_MARGIN_S / 2
WORKER_SOFT_LIMIT_S = WORKER_HARD_LIMIT_S - 30.0

# A store's token (lib_store.lua) lives as long as its client may still send the store
# again: every try of the patient retry policy, each waiting out an answer that never
# comes, then the backoff's cap (tries whose connects time out take longer: a resend
# after that counts as a duplicate, and nothing is lost).
STORE_TOKEN_TTL_S = int(RETRIES * (SOCKET_TIMEOUT_S + RETRY_CAP_S)) + 60

# A removed tenant's name stays taken this long past its results' TTL: a job it had
# dispatched may still end and be stored (and live its TTL from then) up to a visibility
# timeout after the removal; a team given the name before could read it (an attack
# review: the old team's results under their ids).
REMOVED_NAME_HOLD_S = int(LONGEST_JOB_S + VISIBILITY_MARGIN_S) + 60

# A job's running flag outlives its deadline by this much (slot wait, setup, storing), so
# a killed pool process leaves no flag that claims a running job for long.
RUNNING_MARGIN_S = 120.0

# A worker's heartbeat is written every reaper interval; it counts as gone after this
# many intervals without one (plus a fixed slack for a slow Redis), and its record
# expires after HEARTBEAT_TTL_INTERVALS.
HEARTBEAT_STALE_INTERVALS = 3
HEARTBEAT_STALE_SLACK_S = 2.0
HEARTBEAT_TTL_INTERVALS = 3
HEARTBEAT_MIN_TTL_S = 10


def visibility_timeout(configured: float | None) -> float:
    return configured if configured is not None else LONGEST_JOB_S + VISIBILITY_MARGIN_S


def heartbeat_stale_after(interval_s: float) -> float:
    return HEARTBEAT_STALE_INTERVALS * interval_s + HEARTBEAT_STALE_SLACK_S


def heartbeat_ttl(interval_s: float) -> int:
    return max(int(HEARTBEAT_TTL_INTERVALS * interval_s), HEARTBEAT_MIN_TTL_S)
