"""Metrics over real HTTP: a known batch through a real gateway and worker, then the
collector's and the gateway's /metrics scraped and their counts checked exactly."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from producer.metrics.bounded import MIN_AGE_S
from tests.farmkit import SANDFARM, farm_db, make_farm, wait_for  # noqa: F401
from tests.gatewaykit import api, free_port, tenant_farm, wait_final  # noqa: F401

pytestmark = pytest.mark.timeout(180)
TOKEN = "metrics-token-for-tests"
BATCH = [
    *({"id": f"ok-{i}", "command": "true"} for i in range(3)),
    *({"id": f"bad-{i}", "command": "exit 3"} for i in range(2)),
    {"id": "slow", "code": "import time; time.sleep(30)", "limits": {"timeout_s": 1}},
    {"id": "cancel-me", "command": "sleep 30"},
]


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """(sample name, its labels) -> value, from Prometheus' text format."""
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, frozenset(s.labels.items()))] = s.value
    return found


def value(found: dict, name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


def start_collector(env: dict[str, str], port: int, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [SANDFARM, "metrics", "--port", str(port), *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_metrics_count_a_known_batch_exactly(tenant_farm) -> None:  # noqa: F811
    tf = tenant_farm(SANDFARM_METRICS_TOKEN=TOKEN)
    gateway = tf.start_gateway()
    client = api(gateway, tf.tenant("alpha", rate=0.001, burst=len(BATCH) + 1))
    # no worker yet: everything waits, so the cancel finds its job queued
    assert client.post("/v1/jobs/batch", json={"jobs": BATCH}).status_code == 202
    assert client.post("/v1/jobs/cancel-me/cancel").json()["cancelled"] == ["cancel-me"]
    # the last token goes to a call refused for its conflict (every call takes one)
    assert client.post("/v1/jobs", json={"id": "ok-0", "command": "false"}).status_code == 409
    two = [{"id": "late-1", "command": "true"}, {"id": "late-2", "command": "true"}]
    assert client.post("/v1/jobs/batch", json={"jobs": two}).status_code == 429  # no token
    network = {"id": "net", "command": "true", "limits": {"network": True}}
    assert client.post("/v1/jobs", json=network).status_code == 422
    assert client.get("/no/such/path-1234").status_code == 404  # one label for all such
    worker = tf.farm.start_worker("m", 2)
    statuses = {job["id"]: wait_final(client, job["id"])["status"] for job in BATCH}
    assert sorted(statuses.values()) == sorted(
        ["succeeded"] * 3 + ["failed"] * 2 + ["timed_out", "cancelled"]
    ), statuses

    port = free_port()
    collector = start_collector(tf.farm.env, port)
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        def scraped() -> httpx.Response | None:
            assert collector.poll() is None, collector.stdout.read() if collector.stdout else ""
            try:
                return httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
            except httpx.HTTPError:
                return None

        reply = wait_for(scraped, 20, 0.1, "the collector answers")
        assert reply.status_code == 200, reply.text
        assert httpx.get(url, timeout=5).status_code == 401  # the token is required
        wrong = {"Authorization": "Bearer not-the-token"}
        assert httpx.get(url, headers=wrong, timeout=5).status_code == 401
        text = reply.text
    finally:
        collector.kill()
        collector.wait(10)
    print(text)
    found = samples(text)
    jobs = "sandfarm_jobs_total"
    assert value(found, jobs, tenant="alpha", backend="process", status="succeeded") == 3
    assert value(found, jobs, tenant="alpha", backend="process", status="failed") == 2
    assert value(found, jobs, tenant="alpha", backend="process", status="timed_out") == 1
    assert value(found, jobs, tenant="alpha", backend="none", status="cancelled") == 1
    refused = "sandfarm_admission_refused_total"
    assert value(found, refused, tenant="alpha", reason="rate") == 2  # jobs, not calls
    assert value(found, refused, tenant="alpha", reason="policy") == 1
    assert value(found, refused, tenant="alpha", reason="conflict") == 1
    for hist in ("sandfarm_job_run_seconds", "sandfarm_job_queue_wait_seconds"):
        assert value(found, f"{hist}_count", backend="process") == 6
        assert value(found, f"{hist}_bucket", backend="process", le="+Inf") == 6
    # the timed-out job ran its full second and its kill; the others are quick
    assert value(found, "sandfarm_job_run_seconds_bucket", backend="process", le="1.0") == 5
    assert value(found, "sandfarm_redeliveries_total") == 0
    assert value(found, "sandfarm_duplicate_results_total") == 0
    assert value(found, "sandfarm_jobs_pending", tenant="alpha") == 0
    assert value(found, "sandfarm_jobs_running", tenant="alpha") == 0
    assert value(found, "sandfarm_workers_online") == 1
    assert value(found, "sandfarm_worker_slots", worker=worker.name) == 2
    assert value(found, "sandfarm_slots") == 2
    assert value(found, "sandfarm_redis_up") == 1
    assert 0 <= value(found, "sandfarm_worker_heartbeat_age_seconds", worker=worker.name) < 15
    assert ("sandfarm_celery_queue_length", frozenset({("queue", tf.farm.settings.queue)})) in found
    assert "cancel-me" not in text and "ok-0" not in text  # no job ids as labels

    metrics = httpx.get(f"{gateway.url}/metrics", timeout=5)
    assert metrics.status_code == 401
    wrong = {"Authorization": "Bearer not-the-token"}
    assert httpx.get(f"{gateway.url}/metrics", headers=wrong, timeout=5).status_code == 401
    metrics = httpx.get(
        f"{gateway.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5
    )
    assert metrics.status_code == 200
    gw = samples(metrics.text)
    count = "sandfarm_gateway_request_seconds_count"
    assert value(gw, count, route="/v1/jobs/batch", method="POST", code="202") == 1
    assert value(gw, count, route="/v1/jobs/batch", method="POST", code="429") == 1
    assert value(gw, count, route="/v1/jobs", method="POST", code="422") == 1
    assert value(gw, count, route="/v1/jobs/{job_id}/cancel", method="POST", code="200") == 1
    assert value(gw, count, route="/v1/jobs/{job_id}", method="GET", code="200") >= len(BATCH)
    assert value(gw, count, route="/v1/jobs", method="POST", code="409") == 1
    assert value(gw, count, route="unmatched", method="GET", code="404") == 1
    assert "cancel-me" not in metrics.text and "ok-0" not in metrics.text
    assert "path-1234" not in metrics.text


def test_metrics_stay_private_without_a_token(tenant_farm) -> None:  # noqa: F811
    """The collector names every tenant: beyond loopback only with a token; the gateway,
    which faces tenants, serves no /metrics without one."""
    tf = tenant_farm()
    gateway = tf.start_gateway()
    reply = httpx.get(f"{gateway.url}/metrics", timeout=5)
    assert reply.status_code == 404 and "SANDFARM_METRICS_TOKEN" in reply.json()["detail"]
    exposed = start_collector(tf.farm.env, free_port(), "--host", "0.0.0.0")
    out, _ = exposed.communicate(timeout=30)
    assert exposed.returncode == 1
    assert b"SANDFARM_METRICS_TOKEN" in out and b"Traceback" not in out, out


def test_idle_connections_cannot_pile_up_in_the_collector(make_farm) -> None:  # noqa: F811
    """Each connection held a thread for ever, before its token was checked: 2,000 idle
    ones from anyone who could connect made 2,001 threads (an attack review, stop 39);
    then 32 connections trickling a byte every 5 s held every slot of the first fix, and
    no scrape got through (a second review). Now at most MAX_CONNECTIONS at once, and a
    new connection evicts the oldest still without its request's head."""
    import socket

    from producer.metrics.bounded import MAX_CONNECTIONS

    farm = make_farm()
    port = free_port()
    collector = start_collector({**farm.env, "SANDFARM_METRICS_TOKEN": TOKEN}, port)
    try:

        def up() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).status_code == 401
            except httpx.HTTPError:
                return False

        wait_for(up, 30, 0.2, "the collector answers")
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(80)]
        time.sleep(1)
        threads = len(os.listdir(f"/proc/{collector.pid}/task"))
        assert threads <= MAX_CONNECTIONS + 8, threads  # 80 were opened: not a thread each
        closed = 0
        for sock in idle:
            sock.settimeout(0.2)
            try:
                closed += sock.recv(1) == b""
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed += 1
        assert closed >= 80 - MAX_CONNECTIONS, closed  # those over the bound: at once
        for sock in idle:
            sock.close()
        # more tricklers than slots, each a byte every second, while Prometheus scrapes
        tricklers = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
        time.sleep(MIN_AGE_S + 1.5)  # old enough to be evicted, even accepted late
        scrapes = []
        for _ in range(6):
            for sock in tricklers:
                with contextlib.suppress(OSError):
                    sock.send(b"G")
            try:
                scrapes.append(
                    httpx.get(
                        f"http://127.0.0.1:{port}/metrics",
                        headers={"Authorization": f"Bearer {TOKEN}"},
                        timeout=5,
                    ).status_code
                )
            except httpx.HTTPError as exc:
                scrapes.append(type(exc).__name__)
            time.sleep(1)
        assert scrapes.count(200) >= 5, scrapes  # the tricklers held no slot against it
        for sock in tricklers:
            sock.close()
        scraped = httpx.get(
            f"http://127.0.0.1:{port}/metrics",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=30,
        )
        assert scraped.status_code == 200  # Prometheus is still served
    finally:
        collector.kill()
        collector.wait(10)
