"""Waiting on jobs the farm forgot (its Redis restarted empty, was flushed, or failed over
to a replica without a copy: seen in CI as a wait that ran into its timeout). The wait
ends with JobsLostError naming them, instead of waiting for ever; a job that is only
slow (queued, no worker yet) keeps its wait. Real Redis; no worker, so nothing runs."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

import producer.client
import producer.gateway_client
from producer.batch.run import run_batch
from producer.client import FarmClient
from producer.gateway_client import GatewayClient
from producer.protocol import JobsLostError
from tests.farmkit import Farm, farm_db, make_farm, wait_for  # noqa: F401
from tests.gatewaykit import tenant_farm  # noqa: F401

pytestmark = pytest.mark.timeout(60)


def forget(client: FarmClient, keep_tenants: bool = False) -> int:
    """What a Redis that lost its data looks like to this farm: none of its keys (with
    ``keep_tenants``, the tenants and their API keys stay: a restored registry)."""
    prefix = client.keys.prefix
    kept = (f"{prefix}tenants", f"{prefix}tenant:", f"{prefix}apikey:")
    keys = [
        k
        for k in client.redis.scan_iter(match=f"{prefix}*", count=1000)
        if not (keep_tenants and k.decode().startswith(kept))
    ]
    return int(client.redis.delete(*keys)) if keys else 0


@pytest.fixture(autouse=True)
def quick_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(producer.client, "LOST_CHECK_S", 1.0)
    monkeypatch.setattr(producer.gateway_client, "LOST_CHECK_S", 1.0)
    monkeypatch.setattr(producer.gateway_client, "WAIT_S", 2.0)  # its long-polls, shorter


def test_wait_on_forgotten_jobs_ends_naming_them(make_farm) -> None:  # noqa: F811
    farm: Farm = make_farm()
    with farm.client() as client:
        ids = client.submit_many([{"id": f"gone-{i}", "command": "true"} for i in range(3)])
        assert client.state("gone-0") == "queued"  # the farm held them
        assert forget(client) > 0
        assert client.state("gone-0") == "unknown"
        began = time.monotonic()
        with pytest.raises(JobsLostError) as caught:
            list(client.as_completed(ids, timeout=30))
        assert time.monotonic() - began < 10  # not the 30 s timeout
        assert sorted(caught.value.ids) == sorted(ids)
        assert "3 jobs are unknown to the farm" in str(caught.value)
        assert "'gone-0'" in str(caught.value)


def test_a_tenants_wait_on_forgotten_jobs_ends_naming_them(tenant_farm) -> None:  # noqa: F811
    """The same through the gateway (`batch run --api`): it waited for ever."""
    tf = tenant_farm()
    gateway = tf.start_gateway()
    tenant = GatewayClient(gateway.url, tf.tenant("forgetful"), client_id="lost")
    try:
        ids = tenant.submit_many([{"id": f"gone-{i}", "command": "true"} for i in range(3)])
        assert tenant.state("gone-0") == "queued"  # the farm held them
        with tf.farm.client() as client:
            assert forget(client, keep_tenants=True) > 0
        assert tenant.state("gone-0") == "unknown"
        began = time.monotonic()
        with pytest.raises(JobsLostError) as caught:
            list(tenant.as_completed(ids, timeout=30, rescan_s=0.5))
        assert time.monotonic() - began < 10  # not the 30 s timeout
        assert sorted(caught.value.ids) == sorted(ids)
        assert "3 jobs are unknown to the farm at gateway http://" in str(caught.value)
        # the control: a job queued with no worker is known, and waited on to the end
        kept = tenant.submit_many([{"id": "kept", "command": "true"}])
        with pytest.raises(TimeoutError):  # several lost-job checks ran meanwhile
            list(tenant.as_completed(kept, timeout=4, rescan_s=0.5))
    finally:
        tenant.http.close()


def test_queued_job_without_worker_keeps_waiting(make_farm) -> None:  # noqa: F811
    farm: Farm = make_farm()
    with farm.client() as client:
        ids = client.submit_many([{"command": "true"}])
        with pytest.raises(TimeoutError):  # several lost-job checks ran meanwhile
            list(client.as_completed(ids, timeout=4))
        assert client.state(ids[0]) == "queued"


def test_batch_run_stops_on_forgotten_jobs_and_says_so(make_farm, tmp_path: Path) -> None:  # noqa: F811
    farm: Farm = make_farm()
    lines = tmp_path / "in.jsonl"
    lines.write_text(
        "".join(json.dumps({"id": f"b-{i}", "command": "true"}) + "\n" for i in range(4))
    )
    out = tmp_path / "results.jsonl"
    err = io.StringIO()
    with farm.client() as client:

        def lose_them() -> None:
            wait_for(lambda: client.state("b-3") == "queued", 20, what="the batch submitted")
            forget(client)

        thread = threading.Thread(target=lose_them)
        thread.start()
        report = run_batch(
            [lines], out, client, stderr=Console(file=err, width=300), progress=False
        )
        thread.join()
    assert report.missing == 4
    assert "4 jobs are unknown to the farm" in err.getvalue()
    assert "batch run` resumes them" in err.getvalue()
