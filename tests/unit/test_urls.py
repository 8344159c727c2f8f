"""Redis URLs: Sentinel URLs parsed, bad ones refused naming the URL, passwords hidden,
and kombu given its own form."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from producer.protocol import Settings, broker_config
from producer.protocol.urls import kombu_broker, parse_sentinel, redact


def test_a_sentinel_url_names_its_sentinels_master_and_db() -> None:
    parsed = parse_sentinel("sentinel://:s3cret@10.0.0.1:26379,10.0.0.2:26380/farm/2")
    assert parsed.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380))
    assert (parsed.master, parsed.db, parsed.password) == ("farm", 2, "s3cret")
    assert parse_sentinel("sentinel://h:1/m").db == 0


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("sentinel://10.0.0.1/farm", "is not host:port"),
        ("sentinel://10.0.0.1:26379,/farm", "is not host:port"),
        ("sentinel://10.0.0.1:99999/farm", "is not host:port"),
        ("sentinel://10.0.0.1:26379", "name the primary"),
        ("sentinel://10.0.0.1:26379/farm/x", "only a DB number"),
        ("mysql://10.0.0.1:3306/db", "is not a Redis URL"),
    ],
)
def test_bad_urls_are_refused_naming_the_url(url: str, reason: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(redis_url=url)
    message = str(caught.value)
    assert reason in message and url.split("://")[0] in message


def test_passwords_are_hidden_in_every_scheme() -> None:
    assert redact("sentinel://:pw@h1:1,h2:2/m") == "sentinel://:***@h1:1,h2:2/m"
    assert redact("redis://user:pw@h:6379/0") == "redis://user:***@h:6379/0"
    assert redact("redis://h:6379/0") == "redis://h:6379/0"
    assert redact("redis://h:1/0?password=hunter2") == "redis://h:1/0?password=***"
    assert redact("unix:///r.sock?db=0&password=x") == "unix:///r.sock?db=0&password=***"
    assert redact("redis://:hun/ter2@h:1/0") == "redis://:***@h:1/0"  # "/" in the password
    with pytest.raises(ValidationError) as caught:
        Settings(redis_url="sentinel://:hunter2@h1/m")
    message = caught.value.errors(include_url=False)[0]["msg"]  # what the CLI prints
    assert "h1" in message and "hunter2" not in message


def test_kombu_gets_one_url_per_sentinel_and_the_master_name() -> None:
    url, options = kombu_broker("sentinel://:p%40ss@h1:1,h2:2/farm/3")
    assert url == "sentinel://:p%40ss@h1:1/3;sentinel://:p%40ss@h2:2/3"
    assert options == {"master_name": "farm"}
    config = broker_config(Settings(redis_url="sentinel://h1:1/farm"))
    assert config["broker_url"] == "sentinel://h1:1/0"
    assert config["broker_transport_options"]["master_name"] == "farm"  # type: ignore[index]
    assert kombu_broker("redis://h:6379/0") == ("redis://h:6379/0", {})
