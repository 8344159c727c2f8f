"""The farm's Redis URLs: ``redis://``, ``rediss://``, ``unix://`` and Redis Sentinel's
``sentinel://[:password@]host:port[,host:port...]/<master>[/<db>]``.

A Sentinel URL names the sentinels, not a server: every client (the farm's own, via
redis-py's ``Sentinel``, and Celery's, via kombu's sentinel transport) asks them where
the primary is and asks again after a failover. The password is the primary's (the
sentinels are reached without one: keep them on the farm's private network).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

REDIS_SCHEMES = ("redis", "rediss", "unix", "sentinel")
SENTINEL_PORT = 26379
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass(frozen=True)
class SentinelURL:
    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    password: str | None = None
    username: str | None = None


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0] if "://" in url else ""


def parse_sentinel(url: str) -> SentinelURL:
    """The parts of a ``sentinel://`` URL, or ValueError saying what is wrong with it."""
    shown = redact(url)
    rest = url.split("://", 1)[1] if "://" in url else ""
    netloc, _, path = rest.partition("/")
    userinfo, _, hosts = netloc.rpartition("@")
    username, password = None, None
    if userinfo:
        user, _, secret = userinfo.partition(":")
        username, password = unquote(user) or None, unquote(secret) or None
    sentinels = []
    for item in hosts.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{shown}: {item.strip() or '(empty)'!r} is not host:port")
        sentinels.append((host.strip("[]"), int(port)))
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if not parts or not _NAME_RE.fullmatch(parts[0]):
        raise ValueError(f"{shown}: name the primary after the sentinels: .../<master>")
    if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ValueError(f"{shown}: after the master name only a DB number: .../<master>/<db>")
    db = int(parts[1]) if len(parts) == 2 else 0
    return SentinelURL(tuple(sentinels), parts[0], db, password, username)


def validate(url: str) -> str:
    """``url`` if the farm can use it, else ValueError naming it and the reason."""
    scheme = scheme_of(url)
    if scheme not in REDIS_SCHEMES:
        raise ValueError(
            f"{redact(url)!r} is not a Redis URL: it must start with "
            + " or ".join(f"{s}://" for s in REDIS_SCHEMES)
        )
    if scheme == "sentinel":
        parse_sentinel(url)
    return url


def redact(url: str) -> str:
    """``url`` fit to print: a password in it is replaced by ``***`` (any scheme, also
    a Sentinel URL's list of hosts, which urllib cannot parse)."""
    if "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    rest, question, query = rest.partition("?")
    if question:  # redis-py also takes ?password= (its form for unix:// sockets)
        pairs = [pair.partition("=") for pair in query.split("&")]
        query = "&".join(
            f"{name}{eq}{'***' if name.lower() == 'password' and value else value}"
            for name, eq, value in pairs
        )
    # the last "@" ends the userinfo, even when an unencoded "/" sits in the password
    userinfo, at, after = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.split(':', 1)[0]}:***@{after}"
    return f"{scheme}://{rest}{question}{query}"


def kombu_broker(url: str) -> tuple[str, dict[str, object]]:
    """The broker URL and transport options kombu takes for ``url``: a Sentinel URL
    becomes kombu's ``sentinel://h1:p1/db;sentinel://h2:p2/db`` and ``master_name``."""
    if scheme_of(url) != "sentinel":
        return url, {}
    parsed = parse_sentinel(url)
    auth = ""
    if parsed.password is not None or parsed.username is not None:
        user, secret = (quote(v or "", safe="") for v in (parsed.username, parsed.password))
        auth = f"{user}:{secret}@"
    hosts = [f"sentinel://{auth}{host}:{port}/{parsed.db}" for host, port in parsed.sentinels]
    return ";".join(hosts), {"master_name": parsed.master}
