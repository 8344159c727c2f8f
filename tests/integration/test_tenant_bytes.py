"""A tenant's Redis memory is bounded in bytes, not only in jobs (an attack review: ten
jobs of 14.7 MB added 176 MiB of Redis under a bound of 100,000 jobs). The bytes of the
jobs in its queue (max_queued_mb: submit_jobs.lua, lib_dispatch.lua leave_queue) are
counted at admission and given back exactly once, when dispatch takes each job from the
queue (to run it, or because it was cancelled or expired while waiting), as max_queued
counts jobs; the bytes of its stored results a day
(result_mb_per_day) refuse its next submissions until the next UTC day. Against the
real Redis and Lua scripts, with the test as the worker (as test_chain_protocol.py);
the result budget also through a real gateway over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from producer.client import FarmClient
from producer.jobs import TenantJobs
from producer.protocol import QuotaError, RunningRecord, Settings, connect
from producer.protocol.result_budget import allocated, kept_by
from producer.protocol.scripts import FarmScripts, utc_day
from producer.protocol.tenant_store import TenantStore
from producer.protocol.tenants import MIB, Policy
from sandbox_core import JobResult, JobSpec, Status
from tests.farmkit import (  # noqa: F401
    SANDFARM,
    announce_worker,
    farm_db,
    free_port,
    make_farm,
    private_db,
    wait_for,
)
from tests.gatewaykit import api, tenant_farm  # noqa: F401

RUNNING = RunningRecord(worker="test@host", pid=1, slot=0)
FILE = "x" * 1_000_000  # one seeded file: 1 MB (a job may carry 8 MiB of them)


class Farm:
    """A farm with no worker process; ``online()`` adds one by heartbeat (4 slots), so
    dispatch moves waiting jobs into its Celery queue and the test delivers them."""

    def __init__(self, url: str) -> None:
        tag = uuid.uuid4().hex[:6]
        self.settings = Settings(redis_url=url, queue=f"q-{tag}", key_prefix=f"b-{tag}:")
        self.keys = self.settings.keys
        self.redis = connect(url)
        self.scripts = FarmScripts(self.redis, self.settings)
        self.store = TenantStore(self.redis, self.keys)

    def tenant(self, name: str, **policy: object) -> TenantJobs:
        self.store.add(name, Policy.model_validate(policy))
        return TenantJobs(self.redis, self.settings, name)

    def online(self) -> None:
        announce_worker(self.redis, self.settings, 4)

    def held(self, tenant: str) -> int:
        """The tenant's queued bytes, as admission reads them."""
        return int(self.redis.get(self.keys.queued(tenant)) or 0)

    def size(self, qid: str) -> int:
        """What a waiting job holds in Redis: its message and its state JSON."""
        return int(self.redis.strlen(self.keys.message(qid))) + int(
            self.redis.strlen(self.keys.job(qid))
        )

    def deliver(self) -> str:
        """BRPOP the next message, as a worker's consumer does: its qid."""
        popped = self.redis.brpop([self.settings.queue], 5)
        assert popped is not None, "nothing dispatched"
        return str(json.loads(popped[1])["headers"]["id"])


@pytest.fixture
def farm(redis_url: str) -> Iterator[Farm]:
    with private_db(redis_url) as url:
        made = Farm(url)
        try:
            yield made
        finally:
            made.redis.close()


def big(job_id: str, files: int = 2) -> JobSpec:
    """A job carrying ``files`` MB of seeded files (the attack's shape)."""
    return JobSpec.model_validate(
        {"id": job_id, "command": "true", "files": {f"f{i}.txt": FILE for i in range(files)}}
    )


def refused_count(farm: Farm, tenant: str, reason: str) -> int:
    return int(farm.redis.hget(farm.keys.stats, f"refused|{tenant}|{reason}") or 0)


def test_queued_bytes_are_bounded_and_the_next_job_is_refused_whole(farm: Farm) -> None:
    small = farm.tenant("small", max_queued_mb=8)
    bound = 8 * MIB
    # The attack: jobs of 2 MB of files each, far under max_queued (100,000 jobs).
    accepted: list[str] = []
    refusal: QuotaError | None = None
    for i in range(20):
        try:
            accepted += small.submit([big(f"big-{i}")], None, all_or_nothing=True)
        except QuotaError as exc:
            refusal = exc
            break
    assert refusal is not None and refusal.reason == "queue_bytes", accepted
    assert len(accepted) == 4  # the bound was reached: 2 MB each, 8 MiB in all
    qids = [small.qid(i) for i in accepted]
    held = farm.held("small")
    assert held == sum(farm.size(q) for q in qids)  # exactly what the jobs hold
    assert held <= bound < held + farm.size(qids[0])  # full: one more would pass it
    in_redis = sum(int(farm.redis.memory_usage(farm.keys.message(q)) or 0) for q in qids)
    assert in_redis >= held * 0.9  # Redis really holds them
    assert "max_queued_mb 8" in str(refusal) and "Traceback" not in str(refusal)

    # The refused job wrote nothing; the counter did not move.
    nxt = small.qid(f"big-{len(accepted)}")
    assert not farm.redis.exists(farm.keys.message(nxt), farm.keys.job(nxt))
    assert farm.redis.llen(farm.keys.pending("small")) == len(accepted)
    assert farm.held("small") == held and refused_count(farm, "small", "queue_bytes") == 1

    # No partial admission: a call whose small jobs would fit but whose last does not is
    # refused whole, in either mode.
    tiny = [JobSpec(id=f"tiny-{i}", command="true") for i in range(2)]
    with pytest.raises(QuotaError) as caught:
        small.submit([*tiny, big("big-last")], None, all_or_nothing=False)
    assert caught.value.reason == "queue_bytes"
    for spec in tiny:
        assert not farm.redis.exists(farm.keys.message(small.qid(spec.id or "")))
    assert farm.redis.llen(farm.keys.pending("small")) == len(accepted)
    # The same jobs again are no new bytes: idempotent, not refused.
    assert small.submit([big(accepted[0])], None, all_or_nothing=True) == [accepted[0]]
    assert farm.held("small") == held
    # A call that could never fit says so (a client sends it in parts).
    with pytest.raises(QuotaError, match="alone, over max_queued_mb 8"):
        small.submit([big(f"huge-{i}", 4) for i in range(3)], None, all_or_nothing=True)

    # Another tenant is unaffected: its own bytes, its own bound.
    other = farm.tenant("other")
    assert other.submit([big("o-1"), big("o-2"), big("o-3"), big("o-4")], None, all_or_nothing=True)
    assert farm.held("other") == sum(farm.size(other.qid(f"o-{i}")) for i in range(1, 5))
    assert farm.held("small") == held
    for key in (farm.keys.queued("small"), farm.keys.sizes("small")):
        assert 0 < farm.redis.ttl(key) <= Policy().result_ttl_s  # expire with its queue


def test_queued_bytes_are_given_back_exactly_once(farm: Farm) -> None:
    jobs = farm.tenant("back", max_queued_mb=6)  # three jobs of 2 MB
    ids = jobs.submit([big("b-1"), big("b-2"), big("b-3")], None, all_or_nothing=True)
    qids = [jobs.qid(i) for i in ids]
    sizes = [farm.size(q) for q in qids]
    assert farm.held("back") == sum(sizes)
    assert farm.redis.llen(farm.keys.sizes("back")) == 3  # in step with the queue
    with pytest.raises(QuotaError, match="max_queued_mb 6"):  # full
        jobs.submit([big("b-4")], None, all_or_nothing=True)

    # b-2 is cancelled while it waits: it counts until dispatch reaches it (as max_queued
    # counts it); b-3's message expires while it waits. A worker comes online: dispatch
    # takes all three from the queue, each giving its bytes back once (b-1 to run).
    assert jobs.cancel("b-2")
    farm.redis.pexpire(farm.keys.message(qids[2]), 1)
    time.sleep(0.01)
    assert farm.held("back") == sum(sizes)
    farm.online()
    assert farm.scripts.dispatch() == 1
    assert farm.held("back") == 0 and not farm.redis.exists(farm.keys.queued("back"))
    assert farm.redis.llen(farm.keys.sizes("back")) == 0

    # b-1 begins, is delivered again (its worker died), stores, and a duplicate comes:
    # nothing more is given back, nothing goes below zero.
    first = farm.deliver()
    assert first == qids[0]
    assert farm.scripts.begin_attempt(first, RUNNING, 30, "tok-1") is not None
    assert farm.scripts.begin_attempt(first, RUNNING, 30, "tok-2") is not None
    done = JobResult(id="b-1", status=Status.SUCCEEDED)
    assert farm.scripts.store_result(done, None, first, "back")
    assert not farm.scripts.store_result(done, None, first, "back")
    assert farm.held("back") == 0

    # Room again: the tenant's next jobs are accepted, and counted anew while they wait
    # (the worker gone, nothing takes them from the queue).
    farm.redis.hdel(farm.keys.workers, "w")
    assert jobs.submit([big("b-4"), big("b-5")], None, all_or_nothing=True) == ["b-4", "b-5"]
    fresh = farm.size(jobs.qid("b-4")) + farm.size(jobs.qid("b-5"))
    assert farm.held("back") == fresh


def test_a_removed_tenants_waiting_bytes_are_given_back(farm: Farm) -> None:
    jobs = farm.tenant("gone", max_queued_mb=8)
    jobs.submit([big("g-1"), big("g-2")], None, all_or_nothing=True)
    assert farm.held("gone") > 4 * 10**6
    assert farm.store.remove("gone", farm.scripts) == (2, 0)
    assert farm.held("gone") == 0 and not farm.redis.exists(farm.keys.sizes("gone"))


def test_a_spent_result_budget_refuses_over_http(tenant_farm) -> None:  # noqa: F811
    tf = tenant_farm()
    gateway = tf.start_gateway()
    settings = tf.farm.settings
    r: redis.Redis = connect(settings.redis_url)
    scripts = FarmScripts(r, settings)
    spender = api(gateway, tf.tenant("spender", result_mb_per_day=1))
    other = api(gateway, tf.tenant("bystander", result_mb_per_day=1))

    def result(job_id: str, chars: int) -> JobResult:
        """A worker's result of ``chars`` characters of output (as a message)."""
        made = JobResult(id=job_id, status=Status.FAILED, message="y" * chars)
        made.labels = {"group": "g1"}
        return made

    def counted(field: str = "kept") -> int:
        """What today's results keep (the budget's count), or their own ``bytes``."""
        return int(r.hget(settings.keys.usage("spender", utc_day()), field) or 0)

    # Under the budget: results come back whole. Three jobs admitted while it is.
    jobs = [{"id": f"r-{i}", "command": "true"} for i in (1, 2, 3)]
    assert spender.post("/v1/jobs/batch", json={"jobs": jobs}).status_code == 202
    assert scripts.store_result(result("r-1", int(0.6 * MIB)), None, "spender/r-1", "spender")
    assert 0.6 * MIB < counted() < MIB
    # The next would pass the budget: it is kept without its output (an attack review: the
    # budget was checked only at admission, so a backlog admitted under it stored 17x it).
    # What it keeps so was charged at its admission: the count does not move.
    kept = counted()
    assert scripts.store_result(result("r-2", int(0.6 * MIB)), None, "spender/r-2", "spender")
    assert counted() == kept < 0.65 * MIB  # r-1 in its size class (0.625 MiB), 3 charges
    job_keys = kept_by(0, "spender/f00", settings.keys.prefix, None) - allocated(16)
    lean = spender.get("/v1/jobs/r-2").json()
    assert lean["status"] == "failed" and lean["labels"] == {"group": "g1"}
    assert "output dropped" in lean["message"] and "result_mb_per_day" in lean["message"]
    # Bytes as stored, not characters: a result of 2-byte characters counts its bytes.
    last = result("r-3", 0)
    last.message = "\u00e9" * 50_000  # 2 bytes each in UTF-8
    stored = counted("bytes")
    assert scripts.store_result(last, None, "spender/r-3", "spender")
    assert counted("bytes") - stored == len(last.model_dump_json().encode())
    assert spender.get("/v1/jobs/r-3").json()["message"] == last.message
    # Results that fill what is left, each kept whole, until less than 4 KiB is left.
    fill = 0
    while MIB - counted() > 4096:
        room = MIB - counted() - job_keys
        size = max(s for s in range(room - room // 4, room + 1, 8) if allocated(s + 16) <= room)
        made = result(f"f{fill:02d}", 0)  # an id as long as r-2's: the same keys
        made.message = "z" * (size - len(made.model_dump_json().encode()))
        assert scripts.store_result(made, None, f"spender/f{fill:02d}", "spender")
        assert spender.get(f"/v1/jobs/f{fill:02d}").json()["message"] == made.message
        fill += 1
    assert MIB - 4096 <= counted() <= MIB and fill < 20  # the day's budget is nearly reached
    # Jobs are admitted while what their results keep at the least fits, each charged that
    # at once (its state record says how much); the next is refused.
    admitted = 3
    while True:
        before = counted()
        reply = spender.post("/v1/jobs", json={"id": f"r-{admitted + 1}", "command": "true"})
        if reply.status_code != 202:
            break
        admitted += 1
        record = json.loads(r.get(settings.keys.job(f"spender/r-{admitted}")) or "{}")
        assert counted() - before == record["kept"] > 1000
    assert 3 < admitted < 8 and counted() <= MIB
    assert counted() + record["kept"] > MIB  # refused because the next would not fit
    assert reply.status_code == 429, reply.text
    body = reply.json()
    assert body["type"].endswith("/budget") and "result_mb_per_day" in body["detail"]
    assert "Traceback" not in reply.text
    retry = int(reply.headers["Retry-After"])
    assert 0 < retry <= 86_400 - int(time.time()) % 86_400 + 1  # the next UTC day
    refused = f"spender/r-{admitted + 1}"
    assert not r.exists(settings.keys.message(refused), settings.keys.job(refused))
    batch = spender.post("/v1/jobs/batch", json={"jobs": [{"id": "r-99", "command": "true"}]})
    assert batch.status_code == 429
    # The same budget, another tenant: unaffected.
    assert other.post("/v1/jobs", json={"id": "b-1", "command": "true"}).status_code == 202
    assert r.exists(settings.keys.message("bystander/b-1"))


def _finish(farm: Farm, jobs: TenantJobs, job_id: str) -> None:
    """Submit ``job_id`` (a tiny job), deliver it, begin it and store its result, as a
    worker does."""
    jobs.submit([JobSpec(id=job_id, command="true")], None, all_or_nothing=True)
    qid = farm.deliver()
    assert farm.scripts.begin_attempt(qid, RUNNING, 10, "token") is not None
    result = JobResult(id=job_id, status=Status.SUCCEEDED)
    assert farm.scripts.store_result(result, None, qid, jobs.tenant)


def _memory(farm: Farm) -> int:
    """What every key of this farm's private db holds, by Redis's MEMORY USAGE."""
    return sum(int(farm.redis.memory_usage(k) or 0) for k in farm.redis.scan_iter(count=1000))


def test_the_result_budget_counts_what_a_finished_job_keeps(farm: Farm) -> None:
    """A finished job keeps its record, attempts, stored-by token and job-list entry
    beside its result, for the result TTL: tiny jobs at a high rate grew Redis with none
    of it counted (~550 B a job over a ~450 B result). The day's budget counts it all."""
    farm.online()
    jobs = farm.tenant("tiny", result_mb_per_day=1)
    usage = farm.keys.usage("tiny", utc_day())
    for job_id in ("warm-1", "warm-2"):  # the tenant's shared keys exist from here on
        _finish(farm, jobs, job_id)
    # Counted against measured (40 jobs: Redis grows its lists and hashes in steps), short
    # ids and the longest: never less than Redis holds.
    for shape in ("s-{:d}", "L" + "x" * 120 + "{:07d}"):
        before, kept = _memory(farm), int(farm.redis.hget(usage, "kept") or 0)
        for i in range(40):
            _finish(farm, jobs, shape.format(i))
        held = _memory(farm) - before
        counted = int(farm.redis.hget(usage, "kept") or 0) - kept
        assert held <= counted <= held * 1.5, (shape, held / 40, counted / 40)

    # The attack: tiny jobs until refused. Redis grows by about the budget, no more.
    before = _memory(farm)
    refusal: QuotaError | None = None
    finished = 0
    while refusal is None and finished < 5_000:
        try:
            _finish(farm, jobs, f"t-{finished}")
            finished += 1
        except QuotaError as exc:
            refusal = exc
    assert refusal is not None and refusal.reason == "budget", finished
    assert finished > 500  # it ran: the budget, not something else, stopped it
    grown = _memory(farm) - before
    assert grown <= 1.02 * MIB, grown  # the old count let it reach ~2.2 MiB
    assert int(farm.redis.hget(usage, "bytes") or 0) < 0.5 * MIB  # results alone: far under
    assert "result_mb_per_day" in str(refusal) and "Traceback" not in str(refusal)
    # Another tenant is unaffected.
    _finish(farm, farm.tenant("bystander", result_mb_per_day=1), "b-1")


def test_start_redis_bounds_its_memory_without_eviction_and_doctor_says_so(tmp_path) -> None:
    """The quotas bound each tenant, not their sum: the farm's own Redis is bounded too,
    refusing writes when full rather than evicting queued jobs and results silently."""
    from tests.conftest import require

    require(shutil.which("redis-server") is not None, "redis-server is not installed")
    port = free_port()
    script = Path(__file__).resolve().parents[2] / "ops" / "start_redis.sh"
    env = {**os.environ, "SANDFARM_REDIS_MAXMEMORY": "64mb"}
    subprocess.run([str(script), str(port), str(tmp_path / "redis")], env=env, check=True)
    own = redis.Redis(port=port)
    try:
        wait_for(lambda: _answers(own), 10, 0.05, "the new Redis answers")
        config = own.config_get("maxmemory*")
        assert config["maxmemory"] == str(64 * MIB)
        assert config["maxmemory-policy"] == "noeviction"
        row = _doctor_row(f"redis://127.0.0.1:{port}/0")
        assert row["active"] is True and "noeviction" in row["detail"]
        version = str(own.info("server")["redis_version"])  # the scripts' #!lua needs 7
        row = _doctor_row(f"redis://127.0.0.1:{port}/0", "redis version")
        assert row["active"] is (int(version.split(".")[0]) >= 7) and version in row["detail"]
        # The suite's Redis, as the project's tests run it: no maxmemory, which doctor shows.
        suite = os.environ.get("SANDFARM_REDIS_URL", "redis://127.0.0.1:6379/0")
        if int(connect(suite).config_get("maxmemory")["maxmemory"]) == 0:
            row = _doctor_row(suite)
            assert row["active"] is False and "has no maxmemory" in row["detail"]
    finally:
        with contextlib.suppress(redis.RedisError):
            own.shutdown(nosave=True)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def _doctor_row(url: str, name: str = "redis maxmemory") -> dict:
    run = subprocess.run(
        [SANDFARM, "doctor", "--json"],
        env={**os.environ, "SANDFARM_REDIS_URL": url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    rows = json.loads(run.stdout)["farm"]
    return next(row for row in rows if row["name"] == name)


def test_the_trusted_client_fails_at_once_on_a_job_over_its_bound_alone(farm: Farm) -> None:
    """Waiting would never help: FarmClient raises (a bigger call goes in parts) rather
    than retrying forever; the trusted tenant, made by the client, has room for 100,000
    jobs of ~2 KB."""
    settings = farm.settings.model_copy(update={"client_tenant": "solo"})
    farm.store.ensure("solo", Policy(max_queued_mb=1))
    with FarmClient(settings=settings) as client:
        with pytest.raises(QuotaError, match="alone, over max_queued_mb 1"):
            client.submit_many([big("solo-1")])  # 2 MB
        assert not farm.redis.exists(farm.keys.message("solo/solo-1"))
    with FarmClient(settings=farm.settings) as client:
        client.submit_many([{"command": "true"}])
        policy = farm.store.policy(client.tenant)
        assert policy.max_queued_mb * MIB >= 100_000 * 2_100 * 2  # scale.py's batch, twice


def test_a_count_gone_wrong_is_corrected_when_its_queue_empties(farm: Farm) -> None:
    """A review's findings: a submission racing the tenant's removal left a sum with no
    queue (the name, added again, was refused for bytes it did not hold), and jobs queued
    by a farm that kept no sizes made dispatch pop the sizes of newer jobs (the sum then
    fell below what waited)."""
    keys = farm.keys
    # What the race left: sizes and a sum, no queue.
    farm.redis.rpush(keys.sizes("again"), 6_000_000)
    farm.redis.set(keys.queued("again"), 6_000_000)
    again = farm.tenant("again", max_queued_mb=8)
    assert again.submit([big("a-1"), big("a-2"), big("a-3")], None, all_or_nothing=True)
    assert farm.held("again") == sum(farm.size(again.qid(f"a-{i}")) for i in (1, 2, 3))
    assert farm.redis.llen(keys.sizes("again")) == 3
    farm.store.remove("again", farm.scripts)  # out of the dispatch below

    # Jobs an older farm queued, with no sizes: taking them pops none of the newer ones'.
    old = farm.tenant("old", max_queued_mb=8)
    for i in range(4):
        farm.redis.rpush(keys.pending("old"), old.qid(f"pre-{i}"))
    new = old.submit([big("n-1"), big("n-2")], None, all_or_nothing=True)
    held = farm.held("old")
    assert held == sum(farm.size(old.qid(i)) for i in new)
    farm.online()
    # one move: the four old ones (no message: nothing to run) are taken on the way
    assert farm.scripts.dispatch(max_moves=1) == 1
    assert farm.redis.lrange(keys.pending("old"), 0, -1) == [old.qid("n-2").encode()]
    assert farm.held("old") == farm.size(old.qid("n-2"))
    # the queue emptied: nothing is held, whatever the count said
    while farm.redis.llen(keys.pending("old")):
        farm.redis.rpop(farm.settings.queue)
        farm.scripts.dispatch()
    assert farm.held("old") == 0 and not farm.redis.exists(keys.sizes("old"))


def test_one_call_of_many_jobs_is_answered(farm: Farm) -> None:
    """The codes of a call come back as one string: Lua's unpack failed past ~8,000 (a
    review's finding), after the jobs were written."""
    jobs = farm.tenant("many")
    specs = [JobSpec(id=f"m-{i}", command="true") for i in range(9000)]
    assert len(jobs.submit(specs, None, all_or_nothing=True)) == 9000
    assert farm.redis.llen(farm.keys.sizes("many")) == 9000
