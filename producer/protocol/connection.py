"""The one way the farm connects to Redis, with one retry policy.

Patient clients (the SDK, the worker's task, the gateway) ride out a Redis restart of
about a minute: a dropped connection or a timeout is retried with capped exponential
backoff. Impatient ones (the reaper's heartbeat, a probe before a command) fail at once,
so a loop that must keep sweeping never stalls on a missing broker.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from producer.protocol.urls import parse_sentinel, redact, scheme_of

RETRY_BASE_S = 0.05
RETRY_CAP_S = 2.0
RETRIES = 40  # ~75 s of backoff in all: a Redis restart with AOF replay fits
SOCKET_TIMEOUT_S = 30.0  # a Redis that vanishes without closing the socket
CONNECT_TIMEOUT_S = 5.0
HEALTH_CHECK_S = 10
IMPATIENT_TIMEOUT_S = 2.0


def _options(patient: bool) -> dict[str, Any]:
    if not patient:
        return {
            "socket_timeout": IMPATIENT_TIMEOUT_S,
            "socket_connect_timeout": IMPATIENT_TIMEOUT_S,
            "retry": Retry(ExponentialBackoff(cap=RETRY_CAP_S, base=RETRY_BASE_S), retries=0),
        }
    return {
        "retry": Retry(ExponentialBackoff(cap=RETRY_CAP_S, base=RETRY_BASE_S), retries=RETRIES),
        "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
        "socket_timeout": SOCKET_TIMEOUT_S,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "health_check_interval": HEALTH_CHECK_S,
    }


def connect(url: str, *, patient: bool = True) -> redis.Redis:
    """A Redis client for ``url`` (redis://, rediss://, unix://, sentinel://)."""
    if scheme_of(url) == "sentinel":
        return _primary(url, _options(patient))
    return redis.Redis.from_url(url, **_options(patient))


def _sentinels(url: str) -> tuple[Sentinel, str]:
    parsed = parse_sentinel(url)
    timeouts = {
        "socket_timeout": IMPATIENT_TIMEOUT_S,
        "socket_connect_timeout": IMPATIENT_TIMEOUT_S,
    }
    return Sentinel(list(parsed.sentinels), sentinel_kwargs=timeouts), parsed.master


def _primary(url: str, options: dict[str, Any]) -> redis.Redis:
    """A client of the primary the sentinels name now; on a dropped connection (and on
    a READONLY reply from a demoted primary) it asks them again: the patient client's
    retries ride out a failover as they ride out a restart."""
    parsed = parse_sentinel(url)
    sentinel, master = _sentinels(url)
    client: redis.Redis = sentinel.master_for(
        master, db=parsed.db, password=parsed.password, username=parsed.username, **options
    )
    return client


def check(url: str) -> None:
    """Raise FarmUnavailableError, with the cause in plain words, unless a Redis answers
    at ``url`` within IMPATIENT_TIMEOUT_S (a command should fail in seconds, not retry
    for a minute against a wrong port)."""
    from producer.protocol.errors import FarmUnavailableError

    shown = redact(url)
    try:
        client = connect(url, patient=False)
    except ValueError as exc:  # redis-py's refusal of the URL itself
        raise FarmUnavailableError(shown, str(exc)) from None
    try:
        client.ping()
    except redis.AuthenticationError:
        raise FarmUnavailableError(shown, "authentication failed (wrong password?)") from None
    except redis.ResponseError as exc:
        raise FarmUnavailableError(shown, f"Redis refused: {exc}") from None
    except redis.TimeoutError:
        raise FarmUnavailableError(shown, f"no answer within {IMPATIENT_TIMEOUT_S:g}s") from None
    except redis.ConnectionError as exc:
        raise FarmUnavailableError(shown, _plain(exc)) from None
    finally:
        client.close()


def _plain(exc: Exception) -> str:
    text = str(exc)
    for needle, plain in (
        ("Connection refused", "connection refused (is Redis running there?)"),
        ("Name or service not known", "unknown host"),
        ("Temporary failure in name resolution", "unknown host"),
        ("No such file or directory", "no such socket"),
        ("No master found", "no sentinel answers with a primary of that name"),
        ("timed out", f"no answer within {IMPATIENT_TIMEOUT_S:g}s"),
    ):
        if needle in text:
            return plain
    return text.splitlines()[0] if text else type(exc).__name__


def auth_problem(url: str) -> str | None:
    """Why the farm's Redis at ``url`` is open to whoever reaches it, or None when it asks
    for a password (or cannot be asked). Tenants never get Redis, but a job with network
    access on the process or bwrap backend shares the host's network, broker included."""
    parts = urlsplit(url)
    if parts.scheme == "sentinel":
        sentinel, master = _sentinels(url)
        try:
            host, port = sentinel.discover_master(master)
        except redis.RedisError:
            return None  # no primary known: `status` says so
        target: dict[str, Any] = {"host": host, "port": port}
    elif parts.scheme == "unix":
        target = {"unix_socket_path": parts.path}
    else:
        target = {"host": parts.hostname or "127.0.0.1", "port": parts.port or 6379}
    anonymous = redis.Redis(
        **target,
        socket_timeout=IMPATIENT_TIMEOUT_S,
        socket_connect_timeout=IMPATIENT_TIMEOUT_S,
        ssl=parts.scheme == "rediss",
    )
    try:
        anonymous.ping()
    except (redis.AuthenticationError, redis.ResponseError):
        return None  # it wants credentials: good
    except redis.RedisError:
        return None  # not reachable: `status` says so
    finally:
        anonymous.close()
    where = "unix socket" if parts.scheme == "unix" else target["host"]
    return (
        f"Redis at {redact(url)} answers without a password ({where}): anyone who reaches"
        " it reads every job's code, env and result; set requirepass or ACL users"
        " (ops/start_redis.sh takes SANDFARM_REDIS_PASSWORD) before it is reachable from a"
        " network, or before tenants' jobs get network access"
    )
