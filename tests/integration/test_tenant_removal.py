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
from sandbox_core import JobSpec
from tests.farmkit import private_db


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
