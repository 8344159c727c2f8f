"""One dispatch call's work is bounded, whatever a tenant leaves in its queue: the real
Lua scripts against a real Redis, with a heartbeat as the only worker.

A job cancelled while it waits stays in its tenant's queue until dispatch pops it. One
call popped every such entry in a row (it moved nothing, so nothing counted against the
call) and re-read every waiting tenant's state at each pop: a tenant that cancelled
21,000 queued jobs froze Redis for 4.4 s with 47 tenants waiting (an attack review)."""

from __future__ import annotations

import time
import uuid

import pytest

from producer.jobs import TenantJobs
from producer.protocol import Settings, connect
from producer.protocol.scripts import FarmScripts
from producer.protocol.tenants import Policy
from sandbox_core import JobSpec
from tests.farmkit import announce_worker, private_db

pytestmark = pytest.mark.timeout(300)
CANCELLED = 5000
OTHERS = 20  # tenants with one job waiting each
MAX_DEAD_POPS = 256  # lib_dispatch.lua


def _specs(prefix: str, n: int) -> list[JobSpec]:
    return [JobSpec.model_validate({"id": f"{prefix}{i}", "command": "true"}) for i in range(n)]


def test_cancelled_jobs_in_a_queue_cost_each_dispatch_little(redis_url: str) -> None:
    with private_db(redis_url) as url:
        tag = uuid.uuid4().hex[:6]
        settings = Settings(redis_url=url, queue=f"q-{tag}", key_prefix=f"f-{tag}:")
        r = connect(url)
        keys = settings.keys
        policy = Policy(max_queued=100_000)
        # "a-..." sorts first: on a tie of virtual times, its turn comes first
        attacker = TenantJobs(r, settings, "a-attacker")
        attacker.tenants.add("a-attacker", policy)
        attacker.submit(_specs("c", CANCELLED), None, all_or_nothing=True)
        for i in range(0, CANCELLED):
            assert attacker.cancel(f"c{i}")
        others = []
        for n in range(OTHERS):
            jobs = TenantJobs(r, settings, f"t{n:02d}")
            jobs.tenants.add(f"t{n:02d}", policy)
            jobs.submit(_specs("j", 1), None, all_or_nothing=True)
            others.append(jobs)
        assert r.llen(keys.pending("a-attacker")) == CANCELLED  # the attack is in place
        announce_worker(r, settings, slots=OTHERS)  # a slot frees: dispatch runs
        scripts = FarmScripts(r, settings)
        start = time.perf_counter()
        moved = scripts.dispatch()
        first_s = time.perf_counter() - start
        popped = CANCELLED - r.llen(keys.pending("a-attacker"))
        assert popped <= MAX_DEAD_POPS, popped  # one call pops a bounded number
        # each dead pop charged its tenant, so the others' turns came in the same call
        assert moved == OTHERS and r.llen(settings.queue) == OTHERS, moved
        assert first_s < 0.5, first_s
        calls, slowest = 1, first_s
        while r.llen(keys.pending("a-attacker")) and calls < 100:
            start = time.perf_counter()
            assert scripts.dispatch() == 0  # nothing of the dead ever runs
            slowest = max(slowest, time.perf_counter() - start)
            calls += 1
        assert r.llen(keys.pending("a-attacker")) == 0  # the dead entries still go
        assert calls <= CANCELLED // MAX_DEAD_POPS + 2, calls
        assert slowest < 0.5, slowest


def test_a_tenants_dead_entries_never_hold_up_anothers_jobs(redis_url: str) -> None:
    """A bound on the dead pops of a whole call let a tenant whose virtual time was
    lowest end call after call at its bound while another's jobs waited with slots
    free (a review of the first fix: 78 calls in a row moved nothing). Past its own
    bound a tenant is out of the call, and the others' jobs move in it."""
    with private_db(redis_url) as url:
        tag = uuid.uuid4().hex[:6]
        settings = Settings(redis_url=url, queue=f"q-{tag}", key_prefix=f"f-{tag}:")
        r = connect(url)
        keys = settings.keys
        scripts = FarmScripts(r, settings)
        policy = Policy(max_queued=100_000)
        victim = TenantJobs(r, settings, "b-victim")
        victim.tenants.add("b-victim", policy)
        announce_worker(r, settings, slots=1)
        long_jobs = [
            JobSpec.model_validate({"id": f"v{i}", "command": "true", "limits": {"timeout_s": 600}})
            for i in range(13)
        ]
        victim.submit(long_jobs, None, all_or_nothing=True)  # some dispatched: charged 600 s
        in_flight = r.zcard(keys.active("b-victim"))
        assert in_flight >= 1
        attacker = TenantJobs(r, settings, "a-attacker")
        attacker.tenants.add("a-attacker", policy)
        attacker.submit(_specs("c", CANCELLED), None, all_or_nothing=True)
        for i in range(CANCELLED):
            assert attacker.cancel(f"c{i}")
        # the attacker starts at the farm's clock, below the victim's charges: its dead
        # entries come first
        vtime = {k.decode(): float(v) for k, v in r.hgetall(keys.vtime).items()}
        assert vtime["a-attacker"] + CANCELLED * 0.01 < vtime["b-victim"], vtime
        announce_worker(r, settings, slots=in_flight + 5)  # five slots free up
        moved = scripts.dispatch()
        assert moved >= 5, moved  # the victim's jobs moved in the same call
        assert CANCELLED - r.llen(keys.pending("a-attacker")) <= MAX_DEAD_POPS
