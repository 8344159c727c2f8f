"""A full Redis: over its ``maxmemory`` with ``noeviction`` (ops/start_redis.sh, the
stack's Redis), it refuses every write that adds memory. Nothing may be lost then, no
worker may stop, and no path may grow Redis past its bound; callers hear that it is full.
Each test runs its own redis-server and fills it for real."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest
import redis
from kombu import Connection

from producer.jobs import TenantJobs
from producer.protocol import RunningRecord, Settings, connect
from producer.protocol.scripts import FarmScripts
from producer.protocol.tenant_store import TenantStore
from producer.protocol.tenants import Policy
from sandbox_core import JobResult, JobSpec, Status
from tests.conftest import job_shared_dir
from tests.farmkit import (  # noqa: F401
    SANDFARM,
    Farm,
    announce_worker,
    collect_once,
    farm_db,
    make_farm,
    wait_for,
)
from tests.gatewaykit import tenant_farm  # noqa: F401
from tests.rediskit import fill, oom_errors, private_redis

pytestmark = pytest.mark.timeout(180)

FAST = {"SANDFARM_VISIBILITY_TIMEOUT_S": "6", "SANDFARM_REAPER_INTERVAL_S": "1"}
RUNNING = RunningRecord(worker="test@host", pid=1, slot=0)


@pytest.mark.parametrize("hold", ["held", "redelivered"])
def test_a_full_redis_refusing_the_store_loses_no_result(
    make_farm,  # noqa: F811
    tmp_path: Path,
    hold: str,
) -> None:
    """The result of a job that finishes while Redis is full cannot be stored. That
    killed the worker (kombu's requeue, in a MULTI, raised in Celery's event loop) and
    the job never finished. Now the slot holds the result until Redis has room while its
    message is its own (``held``: stored once, the job ran once); past that
    (``redelivered``: a 6 s visibility timeout) the message stays unacked and runs again
    once there is room. Either way: one result, the worker alive, its heartbeat fresh
    (others' reapers would take a silent worker for dead), serving on."""
    shared = job_shared_dir("sandfarm-full-")
    with private_redis(tmp_path) as server:
        env = FAST if hold == "redelivered" else {"SANDFARM_REAPER_INTERVAL_S": "1"}
        farm: Farm = make_farm(SANDFARM_REDIS_URL=server.url, **env)
        worker = farm.start_worker("full", 1)
        admin = redis.Redis.from_url(server.url)
        runs = shared / "runs"
        with farm.client() as client:
            job_id = client.submit({"command": f"echo ran >> {runs}; sleep 2; echo done"})
            wait_for(runs.exists, 30, what="the job running")
            fill(admin)
            refused = oom_errors(admin)
            # the attack ran: the job ended and its store was refused; nothing is stored
            wait_for(lambda: oom_errors(admin) > refused, 30, what="a write refused")
            time.sleep(3)
            assert client.result(job_id) is None
            assert worker.proc.poll() is None, farm.logs()
            beats = admin.hgetall(farm.settings.keys.workers)
            newest = max(float(json.loads(raw)["ts"]) for raw in beats.values())
            assert time.time() - newest < 5, beats  # written while full (stale: 3 beats + 2 s)
            admin.config_set("maxmemory", 0)  # room again
            result = collect_once(client, [job_id], 60, farm)[job_id]
            assert result.status == Status.SUCCEEDED, (result, farm.logs())
            assert result.steps[0].stdout == "done\n"
            assert client.redis.get(client.keys.duplicates) in (None, b"0")
            if hold == "held":
                assert runs.read_text() == "ran\n"  # stored when there was room, not rerun
            after = client.submit({"command": "echo next"})
            assert collect_once(client, [after], 60, farm)[after].status == Status.SUCCEEDED
            assert worker.proc.poll() is None
            assert "Unrecoverable error" not in worker.log.read_text()


def test_a_full_redis_refuses_submissions_clearly_and_takes_nothing(
    tenant_farm,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Over HTTP, a full Redis is a 503 that says so (with Retry-After), never a
    traceback, and nothing of the refused call is kept (the submit script went past
    maxmemory: its first write can be a DEL, after which Redis lets every write through);
    a job the tenant's policy refuses is still a 422; the CLI says it in one line; with
    room, the same call is taken."""
    with private_redis(tmp_path) as server:
        tf = tenant_farm(SANDFARM_REDIS_URL=server.url)
        gateway = tf.start_gateway()
        key = tf.tenant("full", backends=["process"])
        admin = redis.Redis.from_url(server.url)
        keys = tf.farm.settings.keys
        jobs = {
            "jobs": [{"id": f"f-{i}", "command": "true", "backend": "process"} for i in range(3)]
        }
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=gateway.url, timeout=30, headers=headers) as http:
            assert http.get("/v1/usage").status_code == 200  # the control
            fill(admin)
            refused = oom_errors(admin)
            reply = http.post("/v1/jobs/batch", json=jobs)
            assert oom_errors(admin) > refused  # the attack ran: Redis refused the write
            assert reply.status_code == 503, reply.text
            assert reply.json()["type"].endswith("/full") and "full" in reply.json()["detail"]
            assert int(reply.headers["Retry-After"]) > 0
            assert "Traceback" not in reply.text
            assert not admin.keys(keys.message("full/*")) and not admin.keys(keys.job("full/*"))
            bad = http.post("/v1/jobs", json={"command": "true", "backend": "docker"})
            assert bad.status_code == 422, bad.text  # never "full, send it again"
            env = {**os.environ, **tf.farm.env}
            cli = subprocess.run(
                [SANDFARM, "submit", "--command", "true"], env=env, capture_output=True, text=True
            )
            assert cli.returncode == 1, (cli.stdout, cli.stderr)
            assert "Redis is full" in cli.stderr and "Traceback" not in cli.stderr, cli.stderr
            admin.config_set("maxmemory", 0)
            assert http.post("/v1/jobs/batch", json=jobs).status_code == 202
            assert len(admin.keys(keys.message("full/*"))) == 3


class Farmlet:
    """A farm with no worker process on a private Redis; the test is the worker."""

    def __init__(self, url: str) -> None:
        tag = uuid.uuid4().hex[:6]
        self.settings = Settings(redis_url=url, queue=f"q-{tag}", key_prefix=f"f-{tag}:")
        self.keys = self.settings.keys
        self.redis = connect(url)
        self.scripts = FarmScripts(self.redis, self.settings)
        self.store = TenantStore(self.redis, self.keys)

    def tenant(self, name: str) -> TenantJobs:
        self.store.add(name, Policy())
        return TenantJobs(self.redis, self.settings, name)


def test_dispatch_moves_nothing_while_redis_is_full(tmp_path: Path) -> None:
    """Every gateway and reaper dispatches now and then. A move copies the job's message
    into the Celery queue; the dispatch script's first write (a ZREM) is one Redis allows
    when full, so every copy after it went through: 67 MiB past maxmemory in a review."""
    with private_redis(tmp_path) as server:
        farm = Farmlet(server.url)
        jobs = farm.tenant("big")
        big = {"a.txt": "x" * 1_000_000}
        specs = [JobSpec.model_validate({"id": "j0", "command": "true", "files": big})]
        specs += [JobSpec(id=f"k{i}", command="true") for i in range(5)]
        jobs.submit(specs, None, all_or_nothing=True)  # no worker yet: all wait
        announce_worker(farm.redis, farm.settings, 8)
        admin = redis.Redis.from_url(server.url)
        fill(admin)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            farm.scripts.dispatch()
        assert farm.redis.llen(farm.settings.queue) == 0  # nothing copied
        admin.config_set("maxmemory", 0)
        assert farm.scripts.dispatch() == 6  # the control: with room, they move


def test_a_delivery_while_full_is_recorded_and_never_lost(tmp_path: Path) -> None:
    """A job begun once (its worker died), put back by the visibility timeout, then
    delivered while Redis is full: kombu could not record it unacked, its begin was
    refused, the requeue found nothing to restore, and recover() does not re-queue a begun
    job: lost (an attack review). The delivery is now recorded by a script a full Redis
    runs (the BRPOP just freed the same bytes), so the visibility timeout brings it back."""
    from worker import kombu_fixes

    kombu_fixes.apply()
    with private_redis(tmp_path) as server:
        farm = Farmlet(server.url)
        announce_worker(farm.redis, farm.settings, 4)
        jobs = farm.tenant("ten")
        text = {"notes.txt": "\u00e9\U0001f600" * 50_000}  # 2- and 4-byte UTF-8: 300 KB
        spec = JobSpec.model_validate({"id": "j1", "command": "true", "files": text})
        jobs.submit([spec], None, all_or_nothing=True)
        qid = jobs.qid("j1")
        queue, admin = farm.settings.queue, redis.Redis.from_url(server.url)
        popped = len(admin.lindex(queue, 0) or b"")  # what the delivery's BRPOP frees
        with Connection(server.url) as conn:
            channel = conn.default_channel
            first = channel.basic_get(queue, no_ack=False)
            assert farm.scripts.begin_attempt(qid, RUNNING, 10, "a") is not None  # then dies
            channel.qos.restore_by_tag(first.delivery_tag, leftmost=True)  # visibility
            channel.qos._delivered.clear()
            assert admin.llen(queue) == 1 and not admin.exists(farm.keys.message(qid))
            fill(admin)
            second = channel.basic_get(queue, no_ack=False)  # BRPOP: allowed when full
            assert second is not None and admin.hexists("unacked", second.delivery_tag)
            # as long as what the BRPOP freed: kombu escaped non-ASCII, 3x (a review)
            record = len(admin.hget("unacked", second.delivery_tag) or b"")
            assert popped > 300_000 and record <= popped + 200, (popped, record)
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                farm.scripts.begin_attempt(qid, RUNNING, 10, "b")  # the attack ran
            second.reject(requeue=True)  # the task's Reject: refused, left unacked
            assert admin.hexists("unacked", second.delivery_tag)
            admin.config_set("maxmemory", 0)
            channel.qos.visibility_timeout = 0  # its visibility timeout passes
            channel.qos._vrestore_count = 0
            channel.qos.restore_visible(num=100)
            assert admin.llen(queue) == 1  # back in the queue: a worker runs it again
            assert len(admin.lindex(queue, 0) or b"") <= popped + 200  # put back as compact
            third = channel.basic_get(queue, no_ack=False)
            assert third is not None and third.headers["id"] == qid
            assert farm.scripts.begin_attempt(qid, RUNNING, 10, "c") is not None


def test_completions_while_full_name_what_they_cannot_give_back(
    tenant_farm,  # noqa: F811
    tmp_path: Path,
) -> None:
    """GET /v1/completions pops the client's announcements (allowed when full) and puts
    back those over the reply's bound (refused when full): they were lost, behind a 503
    saying nothing was taken. Now the reply names them as pending (GET /v1/results has
    them)."""
    with private_redis(tmp_path) as server:
        tf = tenant_farm(SANDFARM_REDIS_URL=server.url, SANDFARM_GATEWAY_MAX_REPLY_MB="1")
        gateway = tf.start_gateway()
        key = tf.tenant("ct")
        settings = tf.farm.settings
        scripts, admin = (
            FarmScripts(connect(server.url), settings),
            redis.Redis.from_url(server.url),
        )
        announce_worker(admin, settings, 4)
        headers = {"Authorization": f"Bearer {key}", "Sandfarm-Client": "mine"}
        with httpx.Client(base_url=gateway.url, timeout=30, headers=headers) as http:
            ids = ["a", "b", "c"]
            batch = {"jobs": [{"id": i, "command": "true"} for i in ids]}
            assert http.post("/v1/jobs/batch", json=batch).status_code == 202
            done = settings.keys.done("ct:mine")
            for _ in ids:  # the test is the worker: results of 0.7 MB, two pass 1 MiB
                qid = str(json.loads(admin.brpop([settings.queue], 5)[1])["headers"]["id"])
                assert scripts.begin_attempt(qid, RUNNING, 10, "t") is not None
                made = JobResult(
                    id=qid.split("/")[1], status=Status.SUCCEEDED, message="y" * 700_000
                )
                assert scripts.store_result(made, done, qid, "ct")
            assert admin.llen(done) == 3
            fill(admin)
            reply = http.get("/v1/completions")
            assert reply.status_code == 200, reply.text
            body = reply.json()
            handed = [r["id"] for r in body["results"]]
            assert len(handed) == 1 and sorted(handed + body["pending"]) == ids
            admin.config_set("maxmemory", 0)
            named = http.post("/v1/results", json={"ids": body["pending"]})
            got = named.json()  # within the reply's bound too: the rest listed pending
            assert sorted([r["id"] for r in got["results"]] + got["pending"]) == body["pending"]
            assert got["results"] and not got["unknown"]


def test_a_resent_finish_while_full_moves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py sends a finishing step again when its answer was lost. The first send
    stored the result and took no next job (none waited); by the resend one waits and
    Redis is full. The resend's store finds its result stored already and writes nothing,
    and the step goes on to take the waiting job: were the pop allowed and the begin after
    it refused, the message would be in no queue (a review's worry). The store's SET NX
    is a write a full Redis refuses even when the key exists, so the resend is refused
    whole, before the pop: the job waits, and the worker's hold sends the step again."""
    from producer.protocol import scripts as protocol_scripts
    from producer.protocol.scripts import ChainStep

    with private_redis(tmp_path) as server:
        farm = Farmlet(server.url)
        announce_worker(farm.redis, farm.settings, 4)
        jobs = farm.tenant("ten")
        queue, admin = farm.settings.queue, redis.Redis.from_url(server.url)
        jobs.submit([JobSpec(id="first", command="true")], None, all_or_nothing=True)
        qid = jobs.qid("first")
        assert admin.rpop(queue) is not None  # delivered
        assert farm.scripts.begin_attempt(qid, RUNNING, 10, "tok") is not None
        # one call, as redis-py sends it twice: the same store token
        monkeypatch.setattr(protocol_scripts, "_store_token", lambda: ("same-call", 60))
        done = JobResult(id="first", status=Status.SUCCEEDED)
        step = ChainStep(qid, "tok", want_next=True, room_s=600.0, running=RUNNING)
        assert farm.scripts.finish_job(done, None, qid, "ten", None, step) == (True, None)
        jobs.submit([JobSpec(id="next", command="true")], None, all_or_nothing=True)
        assert admin.llen(queue) == 1
        fill(admin)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            farm.scripts.finish_job(done, None, qid, "ten", None, step)
        assert admin.llen(queue) == 1  # the message still waits
        admin.config_set("maxmemory", 0)
        stored, taken = farm.scripts.finish_job(done, None, qid, "ten", None, step)
        assert stored and taken is not None and taken.qid == jobs.qid("next")  # taken now
