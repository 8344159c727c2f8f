"""The compose stack end to end, with the real ops/stack.sh, images, engine, HTTP and
Chromium: up from a clean state, a tenant's batch through the gateways, the batch in
Flower (its page in a browser) and in Prometheus, what the stack exposes, and down
leaving nothing behind. Run by `make test-stack` only (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections import Counter

import httpx
import pytest

from producer.gateway_client import GatewayClient
from tests.browserkit import ARTIFACTS, chromium
from tests.conftest import require
from tests.farmkit import wait_for
from tests.stack.stackkit import Stack, new_stack

pytestmark = pytest.mark.timeout(900)  # a cold first run builds every image
TIMINGS: dict[str, float] = {}
BATCH = 20
FAILING = {3, 7, 11, 15, 19}  # these jobs exit 3
GATEWAY_COUNT = "sandfarm_gateway_request_seconds_count"


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    require(os.geteuid() == 0, "the stack needs root (privileged workers, host mounts)")
    require(_docker_answers(), "no Docker engine answers (ops/install_docker.sh)")
    require(shutil.which("chromium") is not None, "Debian's chromium is not installed")
    made = new_stack("sandfarmtest", tmp_path_factory.mktemp("stack"))
    made.check("down", "--volumes")  # whatever an interrupted earlier run left
    t0 = time.monotonic()
    done = made.run("up", timeout=800)
    TIMINGS["up"] = time.monotonic() - t0
    assert done.returncode == 0, f"ops/stack.sh up:\n{done.stderr[-4000:]}"
    made.up_log = done.stdout + done.stderr
    try:
        yield made
    finally:
        made.run("down", "--volumes")
        print("\nstack timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in TIMINGS.items()))


@pytest.fixture(scope="module")
def batch(stack: Stack) -> dict[str, str]:
    """A tenant's 20 process jobs (5 failing) through both gateways: id -> status."""
    key = stack.key_for("team-a")
    urls = [stack.url("SANDFARM_STACK_GATEWAY1_PORT"), stack.url("SANDFARM_STACK_GATEWAY2_PORT")]
    specs = [
        {
            "id": f"job-{i}",
            "backend": "process",
            "command": f"echo {i}; exit {3 if i in FAILING else 0}",
        }
        for i in range(BATCH)
    ]
    t0 = time.monotonic()
    with GatewayClient(urls, key) as client:
        ids = client.submit_many(specs)
        results = {r.id: r.status.value for r in client.as_completed(ids, timeout=180)}
    TIMINGS["batch"] = time.monotonic() - t0
    return results


def _flower(stack: Stack, path: str, auth: bool = True) -> httpx.Response:
    env = stack.env
    creds = (env["SANDFARM_FLOWER_USER"], env["SANDFARM_FLOWER_PASSWORD"]) if auth else None
    return httpx.get(stack.url("SANDFARM_STACK_FLOWER_PORT") + path, auth=creds, timeout=15)


def _prometheus(stack: Stack, path: str, **params: str) -> dict:
    url = stack.url("SANDFARM_STACK_PROMETHEUS_PORT") + path
    reply = httpx.get(url, params=params, timeout=15).json()
    assert reply["status"] == "success", reply
    return reply["data"]


def test_a_batch_through_the_gateways_shows_in_flower(stack: Stack, batch: dict) -> None:
    assert Counter(batch.values()) == {"succeeded": BATCH - len(FAILING), "failed": len(FAILING)}
    assert all(batch[f"job-{i}"] == "failed" for i in FAILING)

    def listed() -> dict | None:
        tasks = _flower(stack, "/api/tasks").json()
        mine = {k.split("/", 1)[1]: t for k, t in tasks.items() if k.startswith("team-a/")}
        done = {k: t for k, t in mine.items() if t.get("result")}
        return done if len(done) == BATCH else None

    tasks = wait_for(listed, 60, 1, "Flower lists the 20 jobs with their results")
    for job_id, status in batch.items():
        assert tasks[job_id]["result"].startswith(f"'{status}"), tasks[job_id]
    workers = _flower(stack, "/api/workers?refresh=1").json()
    project = stack.project
    assert {f"w1@{project}", f"w2@{project}"} <= set(workers), sorted(workers)

    # As an operator sees it: the pages in a real browser (credentials in the URL:
    # Chromium answers Flower's basic-auth challenge with them, XHRs included).
    env = stack.env
    base = stack.url("SANDFARM_STACK_FLOWER_PORT").replace(
        "http://", f"http://{env['SANDFARM_FLOWER_USER']}:{env['SANDFARM_FLOWER_PASSWORD']}@"
    )
    budget = ["--virtual-time-budget=10000", "--window-size=1600,900"]
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "stack-flower-tasks.png"
    shot.unlink(missing_ok=True)
    taken = chromium(*budget, f"--screenshot={shot}", f"{base}/tasks")
    assert shot.exists() and shot.stat().st_size > 10_000, taken.stderr[-2000:]
    dom = chromium(*budget, "--dump-dom", f"{base}/tasks").stdout
    assert "team-a/job-" in dom, dom[-3000:]
    assert "failed exit=3" in dom and "succeeded" in dom, dom[-3000:]
    workers_dom = chromium(*budget, "--dump-dom", f"{base}/workers").stdout
    assert f"w1@{project}" in workers_dom and f"w2@{project}" in workers_dom, workers_dom[-3000:]


def test_prometheus_scrapes_every_target_and_counts_the_batch(stack: Stack, batch: dict) -> None:
    def all_up() -> list | None:
        targets = _prometheus(stack, "/api/v1/targets")["activeTargets"]
        return targets if targets and all(t["health"] == "up" for t in targets) else None

    try:
        targets = wait_for(all_up, 60, 2, "every Prometheus target up")
    except AssertionError:
        targets = _prometheus(stack, "/api/v1/targets")["activeTargets"]
        down = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets]
        raise AssertionError(f"targets not all up: {down}") from None
    jobs = Counter(t["labels"]["job"] for t in targets)
    assert jobs == {"prometheus": 1, "gateway": 2, "farm": 1}, jobs

    # The batch's counts, as Prometheus scraped them from the collector.
    query = 'sum by (status) (sandfarm_jobs_total{tenant="team-a"})'
    expected = {"succeeded": BATCH - len(FAILING), "failed": len(FAILING)}

    def counted() -> dict | None:
        rows = _query(stack, query)
        got = {r["metric"]["status"]: int(float(r["value"][1])) for r in rows}
        return got if got == expected else None

    try:
        wait_for(counted, 30, 1, "Prometheus has the batch's counts")
    except AssertionError:
        rows = _query(stack, query)
        raise AssertionError(f"{query}: {rows}, expected {expected}") from None

    # and the gateways' own series: the batch's submissions by route and code. Each
    # target is scraped on its own 5 s clock, so the gateways' scrape that saw the
    # submissions may come after the collector's: wait for it too.
    def submitted() -> list | None:
        rows = _query(stack, GATEWAY_COUNT)
        return rows if any(r["metric"].get("code") == "202" for r in rows) else None

    try:
        wait_for(submitted, 30, 1, "Prometheus has the gateways' 202s")
    except AssertionError:
        seen = [(r["metric"], r["value"]) for r in _query(stack, GATEWAY_COUNT)]
        raise AssertionError(
            f"no code=202 in Prometheus' {GATEWAY_COUNT}: {seen}; "
            f"the gateways themselves: {_gateways_counts(stack)}"
        ) from None


def _query(stack: Stack, promql: str) -> list:
    return _prometheus(stack, "/api/v1/query", query=promql)["result"]


def _gateways_counts(stack: Stack) -> dict[str, object]:
    """What each gateway counts itself, and how often it restarted: tells a scrape that
    lags from a gateway that lost its counts."""
    token = stack.env["SANDFARM_METRICS_TOKEN"]
    found: dict[str, object] = {}
    for n in (1, 2):
        url = stack.url(f"SANDFARM_STACK_GATEWAY{n}_PORT") + "/metrics"
        text = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=10).text
        counts = [ln for ln in text.splitlines() if ln.startswith(f"{GATEWAY_COUNT}{{")]
        restarts = subprocess.run(
            ["docker", "inspect", stack.container(f"gateway-{n}"), "--format", "{{.RestartCount}}"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        found[f"gateway-{n}"] = {"restarts": restarts, "counts": counts}
    return found


def test_stack_ports_are_published_on_loopback_only(stack: Stack) -> None:
    ids = stack.check("compose", "ps", "-q").split()
    published = {}
    for cid in ids:
        out = subprocess.run(
            ["docker", "inspect", cid, "--format", "{{json .NetworkSettings.Ports}}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for port, bindings in (json.loads(out) or {}).items():
            for binding in bindings or []:
                published[(cid[:12], port)] = binding["HostIp"]
    assert len(published) >= 5, published  # redis, 2 gateways, flower, prometheus
    assert set(published.values()) == {"127.0.0.1"}, published


def test_stack_jobs_run_sandboxed_inside_the_privileged_workers(stack: Stack) -> None:
    """The worker containers hold the host's powers; a job in them holds none: its slot
    uid, no capability, and no way to the broker on the host's loopback."""
    key = stack.key_for("team-probe")
    port = stack.env["SANDFARM_STACK_REDIS_PORT"]
    probe = (
        "import os, socket\n"
        "caps = [l for l in open('/proc/self/status') if l.startswith('CapEff')][0]\n"
        "s = socket.socket()\n"
        "s.settimeout(2)\n"
        f"reached = s.connect_ex(('127.0.0.1', {port})) == 0\n"
        "print(os.getuid(), caps.split()[1], reached)\n"
    )
    with GatewayClient(stack.url("SANDFARM_STACK_GATEWAY1_PORT"), key) as client:
        result = client.result(client.submit({"backend": "process", "code": probe}), timeout=120)
    assert result is not None and result.status.value == "succeeded", result
    uid, caps, reached = result.steps[0].stdout.split()
    assert int(uid) >= 61000, "a job runs as its slot uid, not the container's root"
    assert int(caps, 16) == 0 and reached == "False", result.steps[0].stdout


def test_stack_workers_run_bwrap_and_docker_jobs(stack: Stack) -> None:
    """Every backend works inside the worker containers: bwrap's namespaces and proc
    mount, the host engine's containers (with the kernel's exit status: 137 is an exit
    code, not a SIGKILL)."""
    stack.check("sandfarm", "tenant", "add", "team-all", "--backends", "process,bwrap,docker")
    out = stack.check("sandfarm", "tenant", "key", "create", "team-all")
    key = next(line for line in out.splitlines() if line.startswith("sf_"))
    specs = {b: {"backend": b, "command": "id -u; exit 137"} for b in ("bwrap", "docker")}
    with GatewayClient(stack.url("SANDFARM_STACK_GATEWAY2_PORT"), key) as client:
        ids = {b: client.submit(spec) for b, spec in specs.items()}
        results = {b: client.result(i, timeout=180) for b, i in ids.items()}
    for backend, result in results.items():
        assert result is not None and result.backend == backend and result.steps, result
        step = result.steps[0]
        assert (result.status.value, step.exit_code, step.signal) == ("failed", 137, None), result
        assert int(step.stdout.split()[0]) >= 61000, step.stdout


def test_stack_metrics_need_the_token(stack: Stack) -> None:
    url = stack.url("SANDFARM_STACK_GATEWAY1_PORT") + "/metrics"
    assert httpx.get(url, timeout=10).status_code == 401
    token = stack.env["SANDFARM_METRICS_TOKEN"]
    wrong = httpx.get(url, headers={"Authorization": "Bearer x"}, timeout=10)
    assert wrong.status_code == 401
    good = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert good.status_code == 200 and "sandfarm_gateway_request_seconds" in good.text


def test_stack_docker_socket_only_in_the_workers(stack: Stack) -> None:
    """The engine's socket (root on the host) is in the worker containers, never in
    the tenant-facing gateways, Flower or Prometheus."""
    holders = set()
    for cid in stack.check("compose", "ps", "-q").split():
        out = subprocess.run(
            ["docker", "inspect", cid, "--format", "{{.Name}} {{json .Mounts}}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        name, mounts = out.split(" ", 1)
        if any(m["Source"] == "/var/run/docker.sock" for m in json.loads(mounts)):
            holders.add(name.strip("/").split("_")[1])
    assert holders == {"worker-1", "worker-2"}, holders


def test_stack_redis_refuses_a_client_without_the_password(stack: Stack) -> None:
    import redis

    port = int(stack.env["SANDFARM_STACK_REDIS_PORT"])
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=port, socket_timeout=5).ping()
    password = stack.env["SANDFARM_REDIS_PASSWORD"]
    assert redis.Redis(port=port, password=password, socket_timeout=5).ping()  # control


def test_stack_redis_is_capped_and_refuses_writes_when_full(stack: Stack) -> None:
    """A flood makes the stack's Redis refuse writes, never grow until the host's OOM
    killer ends it (nor evict the farm's keys)."""
    import redis

    port = int(stack.env["SANDFARM_STACK_REDIS_PORT"])
    client = redis.Redis(port=port, password=stack.env["SANDFARM_REDIS_PASSWORD"])
    config = client.config_get("maxmemory*")
    cap = int(config["maxmemory"])
    assert 0 < cap <= _host_memory_bytes() // 2 + 1024, config
    assert config["maxmemory-policy"] == "noeviction", config
    # full: the cap just above what Redis holds now, then a write past it
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used + 1_000_000)
    try:
        client.set("sandfarm-test:small", "x")  # the control: room for a small write
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("sandfarm-test:flood", "x" * 4_000_000)
        assert client.exists("sandfarm-test:small")  # nothing evicted
    finally:
        client.config_set("maxmemory", cap)
        client.delete("sandfarm-test:small", "sandfarm-test:flood")


def _host_memory_bytes() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def test_stack_flower_refuses_requests_without_auth(stack: Stack) -> None:
    for path in ("/", "/tasks", "/workers", "/api/workers", "/api/tasks", "/api/task/info/x"):
        assert _flower(stack, path, auth=False).status_code == 401, path
    # Flower's own /metrics is open (its handler asks for no user): counts, no job data
    open_metrics = _flower(stack, "/metrics", auth=False).text
    assert "job-" not in open_metrics and "team-a" not in open_metrics
    wrong = httpx.get(stack.url("SANDFARM_STACK_FLOWER_PORT") + "/api/workers", auth=("a", "b"))
    assert wrong.status_code == 401
    assert _flower(stack, "/api/workers").status_code == 200  # the positive control


def test_stack_secrets_are_generated_private_and_never_printed(stack: Stack) -> None:
    assert stack.env_file.stat().st_mode & 0o777 == 0o600
    secrets = {k: v for k, v in stack.env.items() if "PASSWORD" in k or "TOKEN" in k}
    assert set(secrets) == {
        "SANDFARM_REDIS_PASSWORD",
        "SANDFARM_FLOWER_PASSWORD",
        "SANDFARM_METRICS_TOKEN",
    }
    assert all(len(v) >= 32 for v in secrets.values()), "secrets must be generated, long"
    again = stack.run("up")  # an up of a running stack changes nothing, says as much
    assert again.returncode == 0, again.stderr[-4000:]
    log = stack.up_log + again.stdout + again.stderr
    for name, value in secrets.items():
        assert value not in log, f"ops/stack.sh printed {name}"


def test_stack_down_leaves_no_container_network_or_volume(stack: Stack) -> None:
    assert stack.leftovers()["volumes"], "the stack has named volumes while up"
    t0 = time.monotonic()
    stack.check("make", "stack-down")
    TIMINGS["down"] = time.monotonic() - t0
    left = stack.leftovers()
    assert left["containers"] == [] and left["networks"] == [], left
    assert sorted(left["volumes"]) == [
        f"{stack.project}_prometheus-data",
        f"{stack.project}_redis-data",
    ], "named data volumes stay unless asked"
    stack.check("make", "stack-down", "VOLUMES=1")
    assert stack.leftovers() == {"containers": [], "networks": [], "volumes": []}
