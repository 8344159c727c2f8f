"""A backlog admitted under a tenant's result budget cannot store past it.

An attack review: the budget (result_mb_per_day) was checked at admission against what
was stored already, so a tenant queued jobs while nothing of its had finished, and every
one of them then stored its result without output (id, status, labels: up to ~9 KB with
32 labels of 256 B) past the budget: 20 MiB under a 1 MiB budget with 1,000 jobs. Now
admission charges each job what its result keeps at the least (result_budget.py), so the
backlog is refused at the budget. Through a real gateway over HTTP and a real worker
running every admitted job."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
import redis

from producer.gateway_client import GatewayClient
from producer.protocol import QuotaError, connect
from producer.protocol.result_budget import allocated, kept_by
from producer.protocol.scripts import FarmScripts, utc_day
from producer.protocol.tenants import MIB
from sandbox_core import JobResult, JobSpec, Status
from tests.farmkit import farm_db, make_farm, wait_for  # noqa: F401
from tests.gatewaykit import api, tenant_farm  # noqa: F401
from tests.integration.test_tenant_bytes import Farm, farm  # noqa: F401

LABELS = {f"k{i:02d}": chr(ord("a") + i % 26) * 250 for i in range(32)}  # ~8.5 KB as JSON
OUTPUT = "printf '%04000d' 0"  # 4,000 B of stdout


def _memory(r: redis.Redis, prefix: str) -> int:
    """What every key of this farm holds, by Redis's MEMORY USAGE."""
    keys = list(r.scan_iter(match=f"{prefix}*", count=1000))
    return sum(int(r.memory_usage(k) or 0) for k in keys)


def test_a_backlog_admitted_under_the_result_budget_cannot_store_past_it(tenant_farm) -> None:  # noqa: F811
    tf = tenant_farm()
    gateway = tf.start_gateway()
    settings = tf.farm.settings
    keys, prefix = settings.keys, settings.keys.prefix
    r = connect(settings.redis_url)
    key = tf.tenant("hoarder", result_mb_per_day=1)
    hoarder = api(gateway, key)
    bystander = api(gateway, tf.tenant("bystander", result_mb_per_day=1))
    usage = keys.usage("hoarder", utc_day())

    def job(n: int) -> dict:
        return {"id": f"h-{n:04d}", "command": OUTPUT, "labels": LABELS}

    # A call whose results alone could never fit in a day's budget is refused whole, with
    # what to do instead; nothing of it is kept or charged.
    whole = hoarder.post("/v1/jobs/batch", json={"jobs": [job(9000 + n) for n in range(150)]})
    assert whole.status_code == 429, whole.text
    assert "send fewer per call" in whole.json()["detail"] and whole.json()["fewer"] is True
    assert int(whole.headers["Retry-After"]) <= 1 and "Traceback" not in whole.text
    assert not r.exists(keys.job("hoarder/h-9000")) and not r.hexists(usage, "kept")

    # The attack: no worker runs yet, so nothing of the tenant's is stored; it queues 300
    # labels-heavy jobs (the old admission took all 300). The SDK sends a call refused as
    # more than is left in smaller ones, until not one more fits.
    before = _memory(r, prefix)
    with GatewayClient(gateway.url, key) as sdk, pytest.raises(QuotaError) as caught:
        sdk.submit_many([job(n) for n in range(300)], batch=100)
    refusal = caught.value
    assert refusal.reason == "budget" and not refusal.fewer, refusal
    assert "held for the results" in str(refusal) and str(refusal).startswith("tenant 'hoarder': ")
    admitted = len(refusal.submitted)  # what the calls before took, as the SDK says
    assert sorted(refusal.submitted) == [f"h-{n:04d}" for n in range(admitted)]
    charge = json.loads(r.get(keys.job("hoarder/h-0000")) or "{}")["kept"]
    assert charge > len(json.dumps(LABELS))  # what a result without output keeps, at least
    assert admitted == MIB // charge > 50  # it ran, and filled the budget to the last job
    assert int(r.hget(usage, "kept") or 0) == admitted * charge  # charged at admission
    assert r.llen(keys.pending("hoarder")) == admitted  # the backlog, all waiting

    # A worker runs every admitted job: each ends with a result, as it ran.
    tf.farm.start_worker("w", concurrency=2)
    qids = [f"hoarder/h-{n:04d}" for n in range(admitted)]
    wait_for(lambda: all(r.exists(keys.result(q)) for q in qids), 180, 0.2, "every result")
    results = [json.loads(raw) for raw in r.mget([keys.result(q) for q in qids])]
    assert {res["status"] for res in results} == {"succeeded"}  # every job ran
    lean = [res for res in results if "output dropped" in (res.get("message") or "")]
    assert lean and all(res["labels"] == LABELS for res in results)
    # What each lean result keeps was charged before it ran: its store gave back the rest.
    for res in lean:
        qid = f"hoarder/{res['id']}"
        record = json.loads(r.get(keys.job(qid)) or "{}")
        payload = r.strlen(keys.result(qid))
        assert kept_by(payload, qid, prefix, record.get("notify")) <= charge
        assert record["kept"] == 0  # given back: the store counted what it keeps

    # Redis grew by about the budget, no more (the old admission: ~3 MiB for these 300).
    # The count is what the results keep: a lean one gave back its charge's slack.
    counted = int(r.hget(usage, "kept") or 0)
    notify = json.loads(r.get(keys.job(qids[0])) or "{}").get("notify")
    sizes = r.mget([keys.result(q) for q in qids])
    exact = sum(kept_by(len(v or b""), q, prefix, notify) for q, v in zip(qids, sizes, strict=True))
    assert counted == exact
    held = sum(int(r.memory_usage(keys.result(q)) or 0) for q in qids)
    assert 0.6 * MIB < held <= counted <= MIB  # the results are there, within the count
    grown = _memory(r, prefix) - before
    assert grown <= 1.1 * MIB, grown  # the results, their keys and the worker's own
    # The budget is spent for today; another tenant's is its own.
    assert hoarder.post("/v1/jobs", json=job(5000)).status_code == 429
    assert bystander.post("/v1/jobs", json={"id": "b-1", "command": "true"}).status_code == 202


SHAPES = {  # what makes a result without output long: its id, labels, escapes, a client
    "L" + "x" * 127: ({}, None),
    "accents": ({f"k{i:02d}": "\u00e9" * 128 for i in range(32)}, None),
    "escapes": ({f'"\\{i:02d}\x01': '"\\\n\x01' * 64 for i in range(32)}, "done:client-1"),
    "client": ({"group": "g1"}, "done:" + "c" * 64),
}


def test_the_admission_charge_covers_every_result_without_output(farm: Farm) -> None:  # noqa: F811
    """Charged at admission, a result kept without its output adds nothing at its store
    (it gives back its charge's slack), whatever its id, labels (non-ASCII, escaped: up
    to 6 bytes a character as JSON), status or client: the charge is at least what it
    keeps (lib_store.lua kept_by)."""
    farm.online()
    jobs = farm.tenant("edge", result_mb_per_day=1)
    usage = farm.keys.usage("edge", utc_day())
    for job_id, (labels, notify) in SHAPES.items():
        spec = JobSpec(id=job_id, command="true", labels=labels)
        jobs.submit([spec], notify, all_or_nothing=True)
    charged = int(farm.redis.hget(usage, "kept") or 0)
    # The rest of the day's budget goes to a result stored with its output.
    room = MIB - charged - 4096 - kept_by(0, "edge/filler", farm.keys.prefix, None)
    size = max(s for s in range(room // 2, room, 64) if allocated(s + 16) <= room)
    filler = JobResult(id="filler", status=Status.SUCCEEDED)
    filler.message = "f" * (size - len(filler.model_dump_json()))
    assert farm.scripts.store_result(filler, None, "edge/filler", "edge")
    spent = int(farm.redis.hget(usage, "kept") or 0)
    assert MIB - 0.3 * MIB < spent <= MIB - 4096  # stored whole: the rest is spent
    for n, (job_id, (labels, notify)) in enumerate(SHAPES.items()):
        qid = jobs.qid(job_id)
        status = Status.MEMORY_EXCEEDED if n % 2 else Status.CANCELLED  # the longest, another
        result = JobResult(id=job_id, status=status, message="m" * 400_000, labels=labels)
        count = int(farm.redis.hget(usage, "kept") or 0)
        charge = json.loads(farm.redis.get(farm.keys.job(qid)) or "{}")["kept"]
        assert farm.scripts.store_result(result, notify, qid, "edge")
        stored = json.loads(farm.redis.get(farm.keys.result(qid)) or "{}")
        assert "output dropped" in stored["message"] and stored["labels"] == labels  # lean
        keeps = kept_by(farm.redis.strlen(farm.keys.result(qid)), qid, farm.keys.prefix, notify)
        assert keeps <= charge <= keeps * 1.3, (job_id, keeps, charge)
        assert int(farm.redis.hget(usage, "kept") or 0) - count == keeps - charge
    assert int(farm.redis.hget(usage, "kept") or 0) <= spent  # nothing more was counted


def test_a_charge_comes_back_when_its_job_keeps_less_or_stores_another_day(
    farm: Farm,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job cancelled while it waits keeps a small result: its charge's rest comes back
    (a review: 90 cancelled jobs held their whole charge, 11.8x what they keep, and the
    tenant was refused for the rest of the day). A job stored on a later day than it was
    charged on is counted whole on the day it is stored, and its charge given back to
    the day it was charged on (a review: charges on the days a backlog was admitted and
    outputs on the day it stored put 1.9x the budget in one day's results)."""
    from producer.protocol import scripts as protocol_scripts

    farm.online()
    jobs = farm.tenant("days", result_mb_per_day=1)
    today = utc_day()
    usage = farm.keys.usage("days", today)
    specs = [JobSpec(id=f"d-{i}", command="true", labels=LABELS) for i in range(4)]
    jobs.submit(specs, None, all_or_nothing=True)
    charge = json.loads(farm.redis.get(farm.keys.job("days/d-0")) or "{}")["kept"]
    assert int(farm.redis.hget(usage, "kept") or 0) == 4 * charge

    assert jobs.cancel("d-0")  # while it waits: a result without labels
    record = json.loads(farm.redis.get(farm.keys.job("days/d-0")) or "{}")
    assert record["kept"] == 0 and record["spec"]  # given back once: the record says so
    cancelled = kept_by(
        farm.redis.strlen(farm.keys.result("days/d-0")), "days/d-0", farm.keys.prefix, None
    )
    assert cancelled < charge / 5
    assert int(farm.redis.hget(usage, "kept") or 0) == 3 * charge + cancelled
    # Its result gone before its record (a farm TTL shorter than the tenant's), it is
    # cancelled again: counted again, but its charge is not given back twice (a review:
    # each re-cancel took ~9.6 KB off the count, until it went under zero).
    farm.redis.delete(farm.keys.result("days/d-0"))
    assert jobs.cancel("d-0")
    assert int(farm.redis.hget(usage, "kept") or 0) == 3 * charge + 2 * cancelled

    # d-1 is stored tomorrow, with its output: counted whole tomorrow, given back today.
    tomorrow = "29991231"
    monkeypatch.setattr(protocol_scripts, "utc_day", lambda now=None: tomorrow)
    result = JobResult(id="d-1", status=Status.SUCCEEDED, message="o" * 4000, labels=LABELS)
    assert farm.scripts.store_result(result, None, "days/d-1", "days")
    whole = kept_by(
        farm.redis.strlen(farm.keys.result("days/d-1")), "days/d-1", farm.keys.prefix, None
    )
    assert whole > charge  # it kept its output
    later = farm.keys.usage("days", tomorrow)
    assert int(farm.redis.hget(later, "kept") or 0) == whole
    assert int(farm.redis.hget(usage, "kept") or 0) == 2 * charge + 2 * cancelled


def test_refusals_say_when_a_smaller_call_would_pass_and_until_when(farm: Farm) -> None:  # noqa: F811
    """A call that can never pass as it is, but would in parts, says so (fewer): its new
    jobs alone over max_queued (FarmClient resent such a call every second, forever) or
    over the burst (not the ids it knows: they take no token of their own, the call one).
    A result budget spent on
    a day that has ended (a call prepared before midnight) is retried at once."""
    from producer.protocol.submission import prepare_all, submit

    jobs = farm.tenant("small", max_queued=5, rate=0.01, burst=4)
    with pytest.raises(QuotaError) as caught:
        jobs.submit(
            [JobSpec(id=f"q-{i}", command="true") for i in range(6)], None, all_or_nothing=True
        )
    assert caught.value.reason == "queue_full" and caught.value.fewer
    assert "6 new jobs alone are over max_queued 5" in str(caught.value)
    # the refused call took a token (every call does: it reads every id), the rest of the
    # burst goes now
    known = [JobSpec(id=f"k-{i}", command="true") for i in range(3)]
    jobs.submit(known, None, all_or_nothing=True)
    with pytest.raises(QuotaError) as caught:
        jobs.submit([*known, JobSpec(id="k-new", command="true")], None, all_or_nothing=True)
    assert caught.value.reason == "rate" and not caught.value.fewer  # 1 new: wait, not split
    assert "over the rate" in str(caught.value)

    spender = farm.tenant("late", result_mb_per_day=1)
    policy = spender.policy()
    yesterday = "20000101"
    farm.redis.hset(farm.keys.usage("late", yesterday), "kept", MIB)  # that day, spent
    before_midnight = datetime(2000, 1, 1, 23, 59, 59, tzinfo=UTC)
    spec = JobSpec(id="l-1", command="true")
    queue = farm.settings.queue
    (prepared,) = prepare_all([spec], "late", policy, None, queue, before_midnight, "x:")
    assert prepared.day == yesterday
    with pytest.raises(QuotaError) as caught:
        submit(farm.scripts, "late", policy, [prepared], all_or_nothing=True)
    assert caught.value.reason == "budget" and caught.value.retry_after_s == 1  # it has ended
    assert spender.submit([spec], None, all_or_nothing=True) == ["l-1"]  # today's is free


def test_the_sdk_sends_what_fits_when_a_part_of_a_call_does_not(tenant_farm) -> None:  # noqa: F811
    """A call refused as more than today's result budget has left goes in halves; a half
    of jobs that keep much refused does not stop the other, whose jobs keep little (a
    review: 8 labels-heavy jobs then 8 light ones; none sent, 5 would have fitted)."""
    tf = tenant_farm()
    gateway = tf.start_gateway()
    settings = tf.farm.settings
    r = connect(settings.redis_url)
    key = tf.tenant("mixed", result_mb_per_day=1)
    scripts = FarmScripts(r, settings)
    usage = settings.keys.usage("mixed", utc_day())
    # The day's budget nearly spent by results stored whole: ~6 KB left.
    left, n = MIB, 0
    while left > 8000:
        room = left - 6000 - kept_by(0, f"mixed/f-{n}", settings.keys.prefix, None)
        size = max(s for s in range(room // 2, room, 16) if allocated(s + 16) <= room)
        filler = JobResult(id=f"f-{n}", status=Status.SUCCEEDED)
        filler.message = "f" * (size - len(filler.model_dump_json()))
        assert scripts.store_result(filler, None, f"mixed/f-{n}", "mixed")
        left, n = MIB - int(r.hget(usage, "kept") or 0), n + 1
    assert 5000 < left <= 8000
    heavy = [{"id": f"h-{i}", "command": "true", "labels": LABELS} for i in range(8)]
    light = [{"id": f"l-{i}", "command": "true"} for i in range(8)]
    with GatewayClient(gateway.url, key) as sdk, pytest.raises(QuotaError) as caught:
        sdk.submit_many([*heavy, *light])
    refusal = caught.value
    assert refusal.reason == "budget" and not refusal.fewer
    assert refusal.submitted and all(i.startswith("l-") for i in refusal.submitted)
    assert MIB - int(r.hget(usage, "kept") or 0) < 1500  # filled to the last light job
