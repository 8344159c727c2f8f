"""One tenant cannot take the gateway from the others: its requests in the handlers are
bounded (producer/gateway/admission.py), keys are checked before a body is read, the
health checks never wait behind the handlers, and one reply of many results is bounded
in bytes. A real gateway over HTTP on loopback, no worker behind it (so a long-poll
waits its whole time; results are stored as a worker stores them)."""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urlparse

import httpx
import pytest

from producer.gateway_client import GatewayClient
from producer.protocol import FarmScripts, connect
from sandbox_core import JobResult, Status
from tests.farmkit import farm_db  # noqa: F401
from tests.gatewaykit import TenantFarm, api

pytestmark = pytest.mark.timeout(180)
THREADS = 200  # producer.gateway.app.THREADS: what one tenant's long-polls once all held


@pytest.fixture(scope="module")
def tenants(farm_db: str, tmp_path_factory):  # noqa: F811
    from tests.farmkit import Farm

    farm = Farm(
        farm_db, tmp_path_factory.mktemp("admission"), env={"SANDFARM_GATEWAY_MAX_REPLY_MB": "1"}
    )
    tf = TenantFarm(farm)
    try:
        tf.start_gateway()
        yield tf
    finally:
        tf.stop()
        farm.stop()


def test_one_tenants_long_polls_leave_the_gateway_to_the_others(tenants: TenantFarm) -> None:
    gw = tenants.gateways[0]
    key = tenants.tenant("flooder")
    flooder, other = api(gw, key), api(gw, tenants.tenant("other"))
    assert flooder.post("/v1/jobs", json={"id": "never-runs", "code": "1"}).status_code == 202
    bound = tenants.farm.settings.gateway_max_in_flight
    statuses: list[int] = []
    lock = threading.Lock()
    # one client (thread-safe) for all the long-polls: making one costs ~50 ms of CPU
    # (its TLS context), and 200 of them took longer than a long-poll waits
    pool = httpx.Limits(max_connections=THREADS + 10, max_keepalive_connections=0)
    shared = httpx.Client(base_url=gw.url, headers=flooder.headers, timeout=30, limits=pool)

    def long_poll() -> None:
        status = shared.get("/v1/jobs/never-runs", params={"wait": 20}).status_code
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=long_poll) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    try:
        # the attack ran: all the refused came back at once, while the admitted still wait
        deadline = time.monotonic() + 15  # the admitted still wait (20 s)
        while len(statuses) < THREADS - bound and time.monotonic() < deadline:
            time.sleep(0.05)
        with lock:
            refused = statuses.count(429)
            answered = len(statuses)
        assert refused == THREADS - bound == answered, (refused, answered)
        # ... and the others are served now, not after the long-polls
        for path in ("/v1/usage", "/healthz", "/readyz"):
            started = time.monotonic()
            reply = other.get(path, timeout=3)
            assert reply.status_code == 200, reply.text
            assert time.monotonic() - started < 5, path  # long before the 20 s polls end
        problem = flooder.get("/v1/usage", timeout=3)
        assert problem.status_code == 429 and problem.headers["Retry-After"] == "1", problem.text
        assert "at most" in problem.json()["detail"]
        # the SDK waits its turn instead of failing
        sdk = GatewayClient(gw.url, key)
        started = time.monotonic()
        usage = sdk.usage()
        sdk_waited = time.monotonic() - started
        sdk.close()
    finally:
        for thread in threads:
            thread.join(30)
        shared.close()
    assert statuses.count(200) == bound, statuses  # the admitted waited their time out
    assert flooder.get("/v1/usage").status_code == 200  # the bound is of requests at once
    assert usage and sdk_waited > 1.5, (usage, sdk_waited)  # its turn came when they ended


def test_an_unknown_key_is_refused_before_its_body_is_read(tenants: TenantFarm) -> None:
    """A caller without a valid key makes the gateway hold nothing: 401 comes while the
    body it announced (16 MiB) is still unsent."""
    url = urlparse(tenants.gateways[0].url)
    for authorization in ("Bearer made-up-key", None):
        with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
            head = [
                "POST /v1/jobs/batch HTTP/1.1",
                f"Host: {url.hostname}",
                "Content-Type: application/json",
                f"Content-Length: {16 * 1024 * 1024}",
            ]
            if authorization:
                head.append(f"Authorization: {authorization}")
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
            sock.sendall(b'{"jobs": [')  # the body's start: the rest never comes
            started = time.monotonic()
            reply = sock.recv(4096).decode("latin-1")
        assert reply.startswith("HTTP/1.1 401"), reply
        assert time.monotonic() - started < 4.5


def test_a_reply_of_many_results_is_bounded_and_the_rest_come_next(tenants: TenantFarm) -> None:
    """Three stored results of 0.6 MB under a 1 MiB bound: each reply carries one, lists
    the others pending, and asking again brings them all (nothing lost), on /v1/results
    and on the client's completion list alike."""
    gw, settings = tenants.gateways[0], tenants.farm.settings
    key = tenants.tenant("bulky")
    client = api(gw, key)
    client.headers["Sandfarm-Client"] = "reader"
    ids = [f"big-{i}" for i in range(3)]
    reply = client.post("/v1/jobs/batch", json={"jobs": [{"id": i, "code": "1"} for i in ids]})
    assert reply.status_code == 202, reply.text
    redis = connect(settings.redis_url)
    scripts = FarmScripts(redis, settings)
    for job_id in ids:  # as a worker stores them: announced on the client's list
        big = JobResult(id=job_id, status=Status.SUCCEEDED, message="x" * 600_000)
        notify = settings.keys.done("bulky:reader")
        assert scripts.store_result(big, notify, f"bulky/{job_id}", "bulky")
    # the attack's material: more stored than one reply may carry
    sizes = [redis.strlen(settings.keys.result(f"bulky/{i}")) for i in ids]
    assert all(size > 600_000 for size in sizes) and sum(sizes) > 1024 * 1024
    asked, seen = list(ids), []
    while asked:
        reply = client.post("/v1/results", json={"ids": asked}).json()
        assert len(reply["results"]) == 1, [r["id"] for r in reply["results"]]
        seen.append(reply["results"][0]["id"])
        assert reply["unknown"] == [] and reply["pending"] == asked[1:]
        asked = reply["pending"]
    assert seen == ids
    announced = []
    for _ in range(3):
        reply = client.get("/v1/completions").json()
        assert len(reply["results"]) == 1
        announced.append(reply["results"][0]["id"])
    assert announced == ids and client.get("/v1/completions").json()["results"] == []


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        lines = status.read().splitlines()
    for line in lines:
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_listing_reads_no_result_whole_and_looks_at_a_bounded_number_of_jobs(
    tenants: TenantFarm,
) -> None:
    """A page of 40 jobs whose results are 2 MB each: the listing's statuses and labels
    come from a few KB of each result, so the gateway's peak memory does not move; and a
    filter that matches nothing returns a short page with a cursor, not a walk of the
    tenant's whole job list in one request."""
    gw, settings = tenants.gateways[0], tenants.farm.settings
    client = api(gw, tenants.tenant("lister"))
    ids = [f"l-{i}" for i in range(40)]
    reply = client.post("/v1/jobs/batch", json={"jobs": [{"id": i, "code": "1"} for i in ids]})
    assert reply.status_code == 202, reply.text
    redis = connect(settings.redis_url)
    scripts = FarmScripts(redis, settings)
    for n, job_id in enumerate(ids):
        status = Status.SUCCEEDED if n % 2 else Status.FAILED
        labels = {"n": str(n), "labels": "x"}  # a label named "labels" reads nothing whole
        big = JobResult(id=job_id, status=status, message="x" * 2_000_000, labels=labels)
        assert scripts.store_result(big, None, f"lister/{job_id}", "lister")
    # the attack's material: 80 MB of results behind one page
    assert sum(redis.strlen(settings.keys.result(f"lister/{i}")) for i in ids) > 80_000_000
    before = peak_rss_mb(gw.proc.pid)

    page = client.get("/v1/jobs", params={"limit": 50}).json()

    grew = peak_rss_mb(gw.proc.pid) - before
    assert page["next"] is None and len(page["jobs"]) == 40
    for job in page["jobs"]:
        n = int(job["id"].removeprefix("l-"))
        assert job["labels"] == {"n": str(n), "labels": "x"}
        assert job["status"] == ("succeeded" if n % 2 else "failed")
    assert grew < 20, f"the gateway's peak memory grew {grew:.0f} MB for one listing"
    assert client.get("/v1/jobs/l-1").json()["status"] == "succeeded"
    filtered = client.get("/v1/jobs", params={"label": "n=7"}).json()
    assert [job["id"] for job in filtered["jobs"]] == ["l-7"]

    # 2,500 more jobs, none of them a match: the first call looks at 2,000 and says where
    # to go on; following the cursor reaches the end, and the match
    more = [{"id": f"m-{i}", "code": "1"} for i in range(2500)]
    for start in range(0, len(more), 500):
        reply = client.post("/v1/jobs/batch", json={"jobs": more[start : start + 500]})
        assert reply.status_code == 202, reply.text
    first = client.get("/v1/jobs", params={"label": "n=7"}).json()
    assert first["jobs"] == [] and first["next"] is not None
    pages, cursor, found = 1, first["next"], []
    while cursor is not None:
        page = client.get("/v1/jobs", params={"label": "n=7", "cursor": cursor}).json()
        found += [job["id"] for job in page["jobs"]]
        cursor, pages = page["next"], pages + 1
    assert found == ["l-7"] and pages == 2
