"""The tenants' gateway over real HTTP on loopback, with real workers behind it: keys,
isolation between tenants, caps, quotas, removal and usage."""

from __future__ import annotations

import subprocess
import threading
import time

import httpx
import pytest

from producer.protocol import connect
from producer.protocol.scripts import utc_day
from tests.farmkit import SANDFARM, farm_db, make_farm, wait_for  # noqa: F401
from tests.gatewaykit import TenantFarm, api, wait_final

pytestmark = pytest.mark.timeout(240)
PROBLEM = "application/problem+json"
SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"


@pytest.fixture(scope="module")
def tenants(farm_db: str, tmp_path_factory, is_root: bool):  # noqa: F811
    from tests.conftest import require
    from tests.farmkit import Farm

    require(is_root, "the farm's sandbox slots need root (per-slot uids)")
    farm = Farm(farm_db, tmp_path_factory.mktemp("gw"))
    tf = TenantFarm(farm)
    try:
        farm.start_worker("gw", 2)
        tf.start_gateway()
        yield tf
    finally:
        tf.stop()
        farm.stop()


def problem_of(reply: httpx.Response, status: int) -> dict:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"].startswith(PROBLEM)
    body = reply.json()
    assert body["status"] == status and body["detail"]
    return body


def test_a_body_that_is_not_json_is_400_saying_so(tenants: TenantFarm) -> None:
    gw = tenants.gateways[0]
    with api(gw, tenants.tenant("json-a")) as client:
        headers = {"content-type": "application/json"}
        # the control: JSON, but no job, is the job's problem (422 naming the field)
        invalid = problem_of(client.post("/v1/jobs", json={"comand": "true"}), 422)
        assert invalid["field"], invalid
        for body in ("notjson", '{"command": "true"'):
            reply = client.post("/v1/jobs", content=body, headers=headers)
            problem = problem_of(reply, 400)
            assert problem["type"].endswith("/malformed"), problem
            assert problem["detail"].startswith("the body is not JSON"), problem
        usage = client.get("/v1/usage").json()
        assert usage["waiting"] == 0 and usage["dispatched"] == 0, usage  # nothing was taken


def test_a_body_of_another_content_type_is_415_saying_so(tenants: TenantFarm) -> None:
    gw = tenants.gateways[0]
    job = '{"command": "echo hi", "backend": "process"}'
    bodies = {
        "/v1/jobs": job,
        "/v1/jobs/batch": '{"jobs": [' + job + "]}",
        "/v1/results": '{"ids": ["x"]}',
        "/v1/jobs/cancel": '{"ids": ["x"]}',
        "/v1/jobs/specs": '{"ids": ["x"]}',
    }
    with api(gw, tenants.tenant("media-a")) as client:
        for path, body in bodies.items():
            # what `curl -d` sends, and a plain-text client
            for media in ("application/x-www-form-urlencoded", "text/plain; charset=utf-8"):
                reply = client.post(path, content=body, headers={"content-type": media})
                problem = problem_of(reply, 415)
                assert problem["type"].endswith("/unsupported-media-type"), problem
                assert media.split(";")[0] in problem["detail"], problem
                assert "application/json" in problem["detail"], problem
        usage = client.get("/v1/usage").json()
        assert usage["waiting"] == 0 and usage["dispatched"] == 0, usage  # nothing was taken
        # the control: the same bodies as JSON are taken
        for path, body in bodies.items():
            reply = client.post(path, content=body, headers={"content-type": "application/json"})
            assert reply.status_code in (200, 202), (path, reply.text)


def test_an_unknown_field_is_matched_against_its_own_bodys_fields(tenants: TenantFarm) -> None:
    """Each route's body is its own model: a typo in a list of ids is not told a job's
    fields, a missing body is not called a job."""
    gw = tenants.gateways[0]
    cases = [
        ("/v1/jobs", {"comand": "true"}, "comand", "did you mean 'command'?"),  # control
        ("/v1/jobs/batch", {"job": []}, "job", "did you mean 'jobs'?"),
        (
            "/v1/jobs/batch",
            {"jobs": [{"command": "x", "limits": {"timeot": 1}}]},
            "jobs.0.limits.timeot",
            "did you mean 'timeout_s'?",
        ),
        ("/v1/results", {"id": ["x"]}, "id", "did you mean 'ids'?"),
        ("/v1/jobs/cancel", {"command": "true"}, "command", "known: ids"),
        ("/v1/jobs/specs", {"command": "true"}, "command", "known: ids"),
    ]
    with api(gw, tenants.tenant("fields-a")) as client:
        for path, body, field, hint in cases:
            problem = problem_of(client.post(path, json=body), 422)
            assert problem["field"] == field, (path, problem)
            assert problem["detail"].endswith(hint), (path, problem)
        missing = problem_of(client.post("/v1/results"), 422)
        assert missing["field"] == "body" and "required" in missing["detail"], missing


def test_keys_missing_malformed_unknown_and_revoked_are_401(tenants: TenantFarm) -> None:
    gw = tenants.gateways[0]
    good = tenants.tenant("auth-a")
    with api(gw, good) as client:  # positive control: the key works
        assert client.get("/v1/usage").status_code == 200
    for headers in (
        {},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer sf_" + "x" * 43},
        {"Authorization": good},  # no scheme
    ):
        reply = httpx.get(f"{gw.url}/v1/usage", headers=headers)
        body = problem_of(reply, 401)
        assert "WWW-Authenticate" in reply.headers, body
    # revocation takes effect on the next request; a second key keeps working (rotation)
    second, record = tenants.store.create_key("auth-a")
    first_id = next(k.id for k in tenants.store.keys_of("auth-a") if k.id != record.id)
    assert tenants.store.revoke_key("auth-a", first_id)
    with api(gw, good) as client:
        problem_of(client.get("/v1/usage"), 401)
    with api(gw, second) as client:
        assert client.get("/v1/usage").json()["tenant"] == "auth-a"
    # the store keeps only hashes
    raw = connect(tenants.farm.settings.redis_url).hgetall(
        tenants.farm.settings.keys.tenant_keys("auth-a")
    )
    assert second.encode() not in b"".join(raw.values())


def test_tenants_never_see_each_other(tenants: TenantFarm) -> None:
    gw = tenants.gateways[0]
    a, b = api(gw, tenants.tenant("iso-a")), api(gw, tenants.tenant("iso-b"))
    sleeper = {"id": "job-1", "code": "import time; time.sleep(30)"}
    assert a.post("/v1/jobs", json=sleeper).status_code == 202
    wait_for(lambda: a.get("/v1/jobs/job-1").json()["status"] == "running", 30)
    # B: the same id is B's own job, separate; A's is invisible and untouchable
    problem_of(b.get("/v1/jobs/job-1"), 404)
    problem_of(b.post("/v1/jobs/job-1/cancel"), 404)
    assert b.post("/v1/jobs/cancel", json={"ids": ["job-1"]}).json()["cancelled"] == []
    unknown = b.post("/v1/results", json={"ids": ["job-1"]}).json()
    assert unknown["unknown"] == ["job-1"] and unknown["results"] == []
    assert b.get("/v1/jobs").json()["jobs"] == []
    assert b.post("/v1/jobs", json={"id": "job-1", "code": "print('b')"}).status_code == 202
    result_b = wait_final(b, "job-1")
    assert result_b["status"] == "succeeded" and result_b["steps"][0]["stdout"] == "b\n"
    # A's job was never touched by any of that
    assert a.get("/v1/jobs/job-1").json()["status"] == "running"
    assert a.post("/v1/jobs/job-1/cancel").json()["cancelled"] == ["job-1"]
    assert wait_final(a, "job-1")["status"] == "cancelled"
    assert wait_final(b, "job-1")["status"] == "succeeded"
    listed = a.get("/v1/jobs").json()["jobs"]
    assert [(j["id"], j["status"]) for j in listed] == [("job-1", "cancelled")]


def test_a_results_wait_costs_redis_only_for_jobs_that_can_end(tenants: TenantFarm) -> None:
    """/v1/results took ids of any length and waited on ids it had never seen, reading
    every one from Redis five times a second for up to a minute: 32 such waits of 1,000
    ids of 16 KB made other tenants' calls ~800 times slower (an attack review). An id
    is at most 128 characters (422, naming it); one that cannot be a job, or that this
    tenant never submitted, is unknown at once, without a wait."""
    gw = tenants.gateways[0]
    client = api(gw, tenants.tenant("poll-a"))
    problem = problem_of(client.post("/v1/results", json={"ids": ["x" * 129], "wait": 5}), 422)
    assert "ids" in problem["detail"], problem
    never = ["no-such-job", "not a job id!", "x" * 128]
    start = time.monotonic()
    reply = client.post("/v1/results", json={"ids": never, "wait": 5})
    assert reply.status_code == 200, reply.text
    assert time.monotonic() - start < 2  # nothing it could wait for
    assert sorted(reply.json()["unknown"]) == sorted(never), reply.json()
    assert reply.json()["pending"] == [] and reply.json()["results"] == []
    # Control: a job that can end is still waited for, and its result comes back.
    assert client.post("/v1/jobs", json={"id": "soon", "command": "sleep 0.5"}).status_code == 202
    reply = client.post("/v1/results", json={"ids": ["soon", "no-such-job"], "wait": 30})
    assert [r["id"] for r in reply.json()["results"]] == ["soon"], reply.json()
    assert reply.json()["unknown"] == ["no-such-job"]


def test_a_client_name_with_a_colon_is_refused_over_http(tenants: TenantFarm) -> None:
    """A client name is the end of its list's key, "done:<tenant>:<client>": one with a
    ":" (or a space, or too long) is 422 naming the header; a host-like name is fine."""
    with api(tenants.gateways[0], tenants.tenant("names")) as client:
        good = client.get("/v1/completions", headers={"Sandfarm-Client": "ci.host@team-1"})
        assert good.status_code == 200 and good.json()["results"] == []  # positive control
        for bad in ("names:other", "two words", "x" * 65):
            reply = client.get("/v1/completions", headers={"Sandfarm-Client": bad})
            assert problem_of(reply, 422)["field"] == "Sandfarm-Client", bad


def test_id_reused_for_another_spec_is_409_and_the_same_spec_is_idempotent(
    tenants: TenantFarm,
) -> None:
    client = api(tenants.gateways[0], tenants.tenant("ids"))
    job = {"id": "same", "code": "print(1)"}
    assert client.post("/v1/jobs", json=job).json() == {"ids": ["same"]}
    assert client.post("/v1/jobs", json=job).status_code == 202
    body = problem_of(client.post("/v1/jobs", json={**job, "code": "print(2)"}), 409)
    assert body["ids"] == ["same"]
    assert wait_final(client, "same")["steps"][0]["stdout"] == "1\n"


def test_caps_refuse_with_422_naming_the_cap(tenants: TenantFarm) -> None:
    client = api(
        tenants.gateways[0],
        tenants.tenant(
            "capped", caps={"timeout_s": 5, "memory_mb": 256}, backends=["process", "bwrap"]
        ),
    )
    cases = [
        ({"code": "1", "backend": "process", "limits": {"timeout_s": 6}}, "limits.timeout_s"),
        ({"code": "1", "backend": "process", "limits": {"memory_mb": 512}}, "limits.memory_mb"),
        ({"code": "1", "backend": "docker"}, "backend"),
        ({"code": "1"}, "backend"),  # the worker's default could be any: it must say
        ({"code": "1", "backend": "process", "limits": {"network": True}}, "limits.network"),
        ({"code": "1", "backend": "process", "limits": {"timeout_s": -1}}, "limits.timeout_s"),
        ({"code": "1", "backend": "process", "bogus": 1}, "bogus"),
    ]
    for spec, field in cases:
        body = problem_of(client.post("/v1/jobs", json=spec), 422)
        assert body["field"] == field, body
    body = problem_of(
        client.post(
            "/v1/jobs", json={"code": "1", "backend": "process", "limits": {"timeout_s": 6}}
        ),
        422,
    )
    assert "cap of 5" in body["detail"]
    # positive control: at the cap it runs
    ok = {"id": "at-cap", "code": "print(5)", "backend": "process", "limits": {"timeout_s": 5}}
    assert client.post("/v1/jobs", json=ok).status_code == 202
    assert wait_final(client, "at-cap")["status"] == "succeeded"
    # nothing refused was queued
    assert client.get("/v1/usage").json()["today"]["jobs"] == 1


def test_rate_limit_429_with_retry_after_and_the_accepted_all_run(tenants: TenantFarm) -> None:
    # rate 1: each check below has seconds to run in, not 0.4 s, on a loaded host
    client = api(tenants.gateways[0], tenants.tenant("rated", rate=1, burst=5))
    accepted, refused = [], []
    for i in range(12):
        reply = client.post("/v1/jobs", json={"id": f"r{i}", "code": "pass"})
        if reply.status_code == 202:
            accepted.append(f"r{i}")
        else:
            body = problem_of(reply, 429)
            assert body["type"].endswith("/rate")
            assert int(reply.headers["Retry-After"]) >= 1
            assert reply.headers["RateLimit-Remaining"] == "0"
            refused.append(f"r{i}")
    assert len(accepted) >= 5 and refused, (accepted, refused)
    for job_id in accepted:
        assert wait_final(client, job_id)["status"] == "succeeded"
    for job_id in refused:
        problem_of(client.get(f"/v1/jobs/{job_id}"), 404)
    # a batch bigger than the burst can never pass: the problem says so (once the call's
    # own token is there: every call takes one before its ids are read)
    time.sleep(1.5)
    big = [{"id": f"big{i}", "code": "pass"} for i in range(6)]
    body = problem_of(client.post("/v1/jobs/batch", json={"jobs": big}), 429)
    assert "burst" in body["detail"]
    # a call of known ids admits nothing, but is work (a read of each, a dispatch): it
    # takes a token too (an attack review: 10 calls of 1,000 known ids in 0.5 s at rate 1;
    # a review of that: calls of conflicting ids took none)
    again = [client.post("/v1/jobs", json={"id": "r0", "code": "pass"}) for _ in range(12)]
    codes = [reply.status_code for reply in again]
    assert codes.count(202) <= 6 and 429 in codes, codes
    assert all(r.json() == {"ids": ["r0"]} for r in again if r.status_code == 202)
    clash = [client.post("/v1/jobs", json={"id": "r0", "code": "print(1)"}) for _ in range(12)]
    codes = [reply.status_code for reply in clash]  # 409: the id names another spec
    assert codes.count(409) <= 6 and 429 in codes, codes


def test_max_queued_429_and_max_running_never_exceeded(tenants: TenantFarm) -> None:
    farm = tenants.farm
    keys, r = farm.settings.keys, connect(farm.settings.redis_url)
    client = api(tenants.gateways[0], tenants.tenant("bounded", max_running=1, max_queued=30))
    jobs = [{"id": f"b{i}", "code": "import time; time.sleep(0.05)"} for i in range(25)]
    assert client.post("/v1/jobs/batch", json={"jobs": jobs}).status_code == 202
    more = [{"id": f"m{i}", "code": "pass"} for i in range(10)]
    body = problem_of(client.post("/v1/jobs/batch", json={"jobs": more}), 429)
    assert body["type"].endswith("/queue_full") and "max_queued 30" in body["detail"]
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(int(r.exists(*[keys.running(f"bounded/b{i}") for i in range(25)])))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        for i in range(25):
            assert wait_final(client, f"b{i}")["status"] == "succeeded"
    finally:
        stop.set()
        sampler.join()
    assert max(samples) == 1, "the attack ran: a job was seen running"
    assert len(samples) > 20
    assert sum(samples) > 5  # sampled while jobs ran, not only after


def test_removed_tenant_queued_jobs_end_cancelled(tenants: TenantFarm) -> None:
    key = tenants.tenant("leaving", max_running=1)
    client = api(tenants.gateways[0], key)
    jobs = [{"id": f"q{i}", "code": "import time; time.sleep(20)"} for i in range(6)]
    assert client.post("/v1/jobs/batch", json={"jobs": jobs}).status_code == 202
    wait_for(lambda: client.get("/v1/jobs/q0").json()["status"] == "running", 30)
    out = subprocess.run(
        [SANDFARM, "tenant", "remove", "leaving", "--yes"],
        env={**tenants.farm.env, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert "5 waiting jobs cancelled, 1 dispatched" in out.stdout
    problem_of(client.get("/v1/jobs/q0"), 401)  # its key is gone at once
    r, keys = connect(tenants.farm.settings.redis_url), tenants.farm.settings.keys
    from sandbox_core import JobResult

    def status(i: int) -> str | None:
        raw = r.get(keys.result(f"leaving/q{i}"))
        return JobResult.model_validate_json(raw).status.value if raw else None

    wait_for(lambda: status(0) == "cancelled", 30, what="the running job cancelled")
    assert [status(i) for i in range(1, 6)] == ["cancelled"] * 5
    assert not any(r.exists(keys.running(f"leaving/q{i}")) for i in range(6))
    # the name is not handed to a new team while the old one's records live
    from producer.protocol import TenantError

    with pytest.raises(TenantError, match="--purge"):
        tenants.tenant("leaving")
    assert tenants.store.remove("leaving", _scripts(tenants), purge=True) == (0, 0)
    assert not any(r.exists(keys.result(f"leaving/q{i}")) for i in range(6))
    with api(tenants.gateways[0], tenants.tenant("leaving")) as newcomer:
        problem_of(newcomer.get("/v1/jobs/q0"), 404)
        assert newcomer.get("/v1/jobs").json()["jobs"] == []


def _scripts(tenants: TenantFarm):
    from producer.protocol import FarmScripts

    return FarmScripts(connect(tenants.farm.settings.redis_url), tenants.farm.settings)


def test_usage_counts_jobs_cpu_and_bytes(tenants: TenantFarm) -> None:
    client = api(tenants.gateways[0], tenants.tenant("metered"))
    spin = (
        "import time\nt=time.process_time()\nwhile time.process_time()-t<0.3: pass\nprint('x'*1000)"
    )
    jobs = [{"id": "u1", "code": spin}, {"id": "u2", "code": "raise SystemExit(3)"}]
    assert client.post("/v1/jobs/batch", json={"jobs": jobs}).status_code == 202
    assert wait_final(client, "u1")["status"] == "succeeded"
    assert wait_final(client, "u2")["status"] == "failed"
    today = client.get("/v1/usage").json()["today"]
    assert today["jobs"] == 2 and today["status:succeeded"] == 1 and today["status:failed"] == 1
    assert today["cpu_ms"] >= 300 and today["wall_ms"] >= 300 and today["bytes"] > 1000


def test_cpu_budget_spent_refuses_with_429(tenants: TenantFarm) -> None:
    client = api(tenants.gateways[0], tenants.tenant("budget", cpu_budget_s_per_day=0.2))
    spin = SPIN
    assert client.post("/v1/jobs", json={"id": "burn", "code": spin}).status_code == 202
    assert wait_final(client, "burn")["status"] == "succeeded"
    body = problem_of(client.post("/v1/jobs", json={"id": "next", "code": "pass"}), 429)
    assert body["type"].endswith("/budget") and "budget" in body["detail"]


def test_body_too_large_is_413_and_long_poll_is_bounded(tenants: TenantFarm) -> None:
    gw = tenants.gateways[0]
    client = api(gw, tenants.tenant("big"))
    limit = tenants.farm.settings.gateway_max_body_mb * 1024 * 1024
    reply = client.post(
        "/v1/jobs", content=b"x" * (limit + 1), headers={"content-type": "application/json"}
    )
    problem_of(reply, 413)

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(limit // 65536 + 2):
            yield b" " * 65536

    problem_of(client.post("/v1/jobs", content=chunks()), 413)
    problem_of(client.get("/v1/jobs/x", params={"wait": 61}), 422)
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ok"}


def test_list_filters_by_status_and_label_with_a_cursor(tenants: TenantFarm) -> None:
    client = api(tenants.gateways[0], tenants.tenant("lister"))
    jobs = [
        {
            "id": f"l{i}",
            "code": "pass" if i % 2 else "raise SystemExit(1)",
            "labels": {"k": str(i % 3)},
        }
        for i in range(9)
    ]
    assert client.post("/v1/jobs/batch", json={"jobs": jobs}).status_code == 202
    for i in range(9):
        wait_final(client, f"l{i}")
    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/jobs", params=params).json()
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(f"l{i}" for i in range(9)) and len(seen) == 9
    failed = client.get("/v1/jobs", params={"status": "failed"}).json()["jobs"]
    assert sorted(j["id"] for j in failed) == ["l0", "l2", "l4", "l6", "l8"]
    labelled = client.get("/v1/jobs", params={"label": "k=1"}).json()["jobs"]
    assert sorted(j["id"] for j in labelled) == ["l1", "l4", "l7"]


def test_cli_submit_result_cancel_through_the_gateway(tenants: TenantFarm) -> None:
    gw = tenants.gateways[0]
    env = {"PATH": "/usr/bin:/bin", "SANDFARM_API_KEY": tenants.tenant("cli"), "COLUMNS": "120"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SANDFARM, *args, "--api", gw.url], env=env, capture_output=True, text=True, timeout=60
        )

    done = cli("submit", "--id", "c1", "--code", "print(6 * 7)", "--wait", "--json")
    assert done.returncode == 0, done.stderr
    assert '"42\\n"' in done.stdout
    again = cli("result", "c1", "--json")
    assert again.returncode == 0 and '"succeeded"' in again.stdout
    slow = cli("submit", "--id", "c2", "--command", "sleep 30")
    assert slow.returncode == 0 and slow.stdout.strip() == "c2"
    stopped = cli("cancel", "c2")
    assert stopped.returncode == 0 and "cancelled 1;" in stopped.stdout, stopped.stdout
    final = cli("result", "c2", "--wait", "--wait-timeout", "30", "--json")
    assert final.returncode == 0 and '"status":"cancelled"' in final.stdout.replace(" ", "")
    unknown = cli("result", "nope")
    assert unknown.returncode == 1 and "nope" in unknown.stderr
    bad = subprocess.run(
        [SANDFARM, "result", "c1", "--api", gw.url],
        env={**env, "SANDFARM_API_KEY": "sf_wrong"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and "API key" in bad.stderr and "Traceback" not in bad.stderr


def test_removing_a_tenant_leaves_no_flood_of_dead_messages(tenants: TenantFarm) -> None:
    """Removal cancels a backlog without dispatching it: the Celery queue stays within
    the farm's room (slots + margin), so other tenants' jobs are not stuck behind
    hundreds of cancelled messages (each a worker delivery for nothing)."""
    key = tenants.tenant("backlog")
    client = api(tenants.gateways[0], key)
    jobs = [{"id": f"b{i}", "command": "/bin/true"} for i in range(600)]
    assert client.post("/v1/jobs/batch", json={"jobs": jobs}).status_code == 202
    r, keys = connect(tenants.farm.settings.redis_url), tenants.farm.settings.keys
    wait_for(lambda: int(r.hget(keys.usage("backlog", utc_day()), "jobs") or 0) >= 20, 30)
    assert r.llen(keys.pending("backlog")) > 300  # the backlog is there, jobs running
    cancelled, _ = tenants.store.remove("backlog", _scripts(tenants))
    assert cancelled > 300
    room = 2 * len(tenants.farm.workers) + tenants.farm.settings.dispatch_margin
    assert r.llen(tenants.farm.settings.queue) <= room, "cancelled jobs were dispatched"
    assert r.llen(keys.pending("backlog")) == 0
