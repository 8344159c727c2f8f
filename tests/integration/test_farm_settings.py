"""Farm settings, keys and message shape: no Redis needed."""

from __future__ import annotations

import pytest

from producer.client import compact_spec
from producer.protocol import Settings, broker_config, margins
from producer.protocol.margins import VISIBILITY_MARGIN_S
from sandbox_core import defaults as d
from sandbox_core import parse_spec


def test_visibility_timeout_is_derived_from_the_longest_job(monkeypatch) -> None:
    monkeypatch.delenv("SANDFARM_VISIBILITY_TIMEOUT_S", raising=False)
    settings = Settings()
    assert settings.visibility_timeout == d.TIMEOUT_S[1] + VISIBILITY_MARGIN_S
    # Celery's hard limit sits above the longest job and below the visibility timeout.
    assert d.TIMEOUT_S[1] < margins.WORKER_HARD_LIMIT_S < settings.visibility_timeout
    monkeypatch.setenv("SANDFARM_VISIBILITY_TIMEOUT_S", "7")
    short = Settings()
    assert short.visibility_timeout == 7
    options = broker_config(short)["broker_transport_options"]
    assert options["visibility_timeout"] == 7
    assert 1 <= options["unacked_restore_interval"] <= 7 / 2


def test_every_setting_has_an_env_var_default_and_description(monkeypatch) -> None:
    monkeypatch.setenv("SANDFARM_REDIS_URL", "redis://example:6379/3")
    monkeypatch.setenv("SANDFARM_MAX_ATTEMPTS", "5")
    settings = Settings()
    assert settings.redis_url == "redis://example:6379/3"
    assert settings.max_attempts == 5
    table = Settings.table()
    for name, field in Settings.model_fields.items():
        assert field.description, name
        assert f"`SANDFARM_{name.upper()}`" in table
    with pytest.raises(ValueError):
        Settings(max_attempts=0)


def test_broker_config_is_json_only_without_result_backend() -> None:
    config = broker_config(Settings())
    assert config["accept_content"] == ["json"]
    assert config["task_serializer"] == "json"
    assert config["result_backend"] is None
    assert config["task_ignore_result"] is True


def test_worker_config_has_the_reliability_settings() -> None:
    from worker.app import worker_config

    config = worker_config(Settings())
    assert config["task_acks_late"] is True
    assert config["task_reject_on_worker_lost"] is True
    assert config["worker_prefetch_multiplier"] == 1
    assert config["task_time_limit"] > d.TIMEOUT_S[1]


def test_compact_spec_round_trips_and_leaves_defaults_out() -> None:
    spec = parse_spec(
        {"id": "a1", "code": "print(1)", "limits": {"timeout_s": 5}, "labels": {"k": "v"}}
    )
    data = compact_spec(spec)
    assert data["limits"] == {"timeout_s": 5}
    assert "files" not in data and "env" not in data
    assert parse_spec(data) == spec
    assert "print" not in spec.summary()
