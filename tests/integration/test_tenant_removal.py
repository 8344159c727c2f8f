"""A removed tenant's name is not handed to a new team while any of its results may
live: the real store and scripts against a real Redis (no worker: the jobs wait).

The name was freed once the removed tenant's job list was gone, but that list's TTL runs
from the last submission while a result's runs from when it is stored, and the list
drops entries by submission time: a team given the name read the old team's results
under their ids (an attack review)."""

from __future__ import annotations

import uuid

import pytest

from producer.jobs import TenantJobs
from producer.protocol import Settings, TenantError, connect
from producer.protocol.scripts import FarmScripts
from producer.protocol.tenants import Policy
from sandbox_core import JobResult, JobSpec, Status
from tests.farmkit import announce_worker, private_db


def test_a_removed_tenants_name_stays_taken_while_its_results_live(redis_url: str) -> None:
    with private_db(redis_url) as url:
        tag = uuid.uuid4().hex[:6]
        settings = Settings(redis_url=url, queue=f"q-{tag}", key_prefix=f"f-{tag}:")
        r, keys = connect(url), settings.keys
        scripts = FarmScripts(r, settings)
        old = TenantJobs(r, settings, "carol")
        old.tenants.add("carol", Policy())
        specs = [JobSpec.model_validate({"id": f"secret-{i}", "command": "true"}) for i in (1, 2)]
        old.submit(specs, None, all_or_nothing=True)
        assert old.tenants.remove("carol", scripts) == (2, 0)
        assert r.exists(keys.result("carol/secret-1"))  # the old team's result lives
        # the job list goes first (its TTL runs from the last submission; it drops old
        # entries): what freed the name before
        r.delete(keys.joblist("carol"))
        with pytest.raises(TenantError, match="--purge"):
            old.tenants.add("carol", Policy())
        # purge finds every record under the name, listed or not, and frees it
        assert old.tenants.remove("carol", scripts, purge=True) == (0, 0)
        assert not r.keys(f"f-{tag}:*carol/*")
        new = TenantJobs(r, settings, "carol")
        new.tenants.add("carol", Policy())
        assert new.results(["secret-1", "secret-2"]) == {}


def _farm(url: str) -> tuple[Settings, object, FarmScripts]:
    tag = uuid.uuid4().hex[:6]
    settings = Settings(redis_url=url, queue=f"q-{tag}", key_prefix=f"f-{tag}:")
    r = connect(url)
    return settings, r, FarmScripts(r, settings)


def test_a_result_stored_after_a_purge_never_outlives_the_names_hold(redis_url: str) -> None:
    """A purge freed the name while a job the tenant had dispatched could still store
    its result: stored after the purge, it lived its week, and a new team under the
    name read it (a review). With jobs still dispatched the purge holds the name for as
    long as they may end, and a result stored meanwhile lives no longer than the hold."""
    with private_db(redis_url) as url:
        settings, r, scripts = _farm(url)
        keys = settings.keys
        announce_worker(r, settings, slots=1)  # the job is dispatched: it may store later
        team = TenantJobs(r, settings, "team")
        team.tenants.add("team", Policy())
        team.submit(
            [JobSpec.model_validate({"id": "report-1", "command": "true"})],
            None,
            all_or_nothing=True,
        )
        assert r.zcard(keys.active("team")) == 1
        assert team.tenants.remove("team", scripts, purge=True) == (0, 1)
        with pytest.raises(TenantError, match="at the latest"):
            team.tenants.add("team", Policy())
        late = JobResult(id="report-1", status=Status.SUCCEEDED, message="SECRET")
        scripts.store_result(late, None, "team/report-1", "team", ttl=7 * 86400)
        held, lives = r.ttl(keys.removed("team")), r.ttl(keys.result("team/report-1"))
        assert 0 < lives <= held, (lives, held)


def test_the_hold_covers_results_kept_longer_than_the_policy_now_says(redis_url: str) -> None:
    """The hold took the tenant's result TTL as the policy said at removal; a result
    stored under a longer TTL before the policy was lowered outlived it (a review)."""
    with private_db(redis_url) as url:
        settings, r, scripts = _farm(url)
        keys = settings.keys
        team = TenantJobs(r, settings, "team")
        team.tenants.add("team", Policy(result_ttl_s=7 * 86400))
        team.submit(
            [JobSpec.model_validate({"id": "old-1", "command": "true"})], None, all_or_nothing=True
        )
        assert team.cancel("old-1")  # stored now, kept a week
        team.tenants.update("team", result_ttl_s=60)
        team.tenants.remove("team", scripts)
        assert r.ttl(keys.removed("team")) >= r.ttl(keys.result("team/old-1")) > 86400
