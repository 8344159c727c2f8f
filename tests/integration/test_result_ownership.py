"""A stored result answers only for the code that ran (lib_store.lua orphaned): the real
scripts against a real Redis, each result stored as a worker stores it (with the record
its job's message names, worker.jobs.spec_digest_of).

Redis restarted empty while a job ran; its id was then sent again with other code. The
old run's result, stored under the new record, answered for code that never ran; stored
before the resubmission, it left no record, so the other code was admitted and got it
(a reliability review)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

from kombu.utils.json import loads as kombu_loads

from producer.jobs import TenantJobs
from producer.protocol import MessageMeta, Settings, connect
from producer.protocol.scripts import FarmScripts
from producer.protocol.submission import prepare_all
from producer.protocol.tenants import Policy
from sandbox_core import JobResult, JobSpec, Status
from tests.farmkit import private_db
from worker.jobs import spec_digest_of


def _farm(url: str) -> tuple[Settings, object, FarmScripts, TenantJobs]:
    tag = uuid.uuid4().hex[:6]
    settings = Settings(redis_url=url, queue=f"q-{tag}", key_prefix=f"f-{tag}:")
    r = connect(url)
    team = TenantJobs(r, settings, "team")
    team.tenants.add("team", Policy())
    return settings, r, FarmScripts(r, settings), team


def _spec(command: str) -> JobSpec:
    return JobSpec.model_validate({"id": "x", "command": command})


def _stored_by_worker(scripts: FarmScripts, spec: JobSpec, stdout: str) -> bool:
    """Store a result for ``spec`` as the worker that ran it does."""
    (prepared,) = prepare_all([spec], "team", Policy(), None, "q", datetime.now(UTC), "p:")
    args = kombu_loads(json.loads(prepared.submission.message)["body"])[0]
    meta = MessageMeta.model_validate(args[1])
    result = JobResult(id="x", status=Status.SUCCEEDED, message=stdout)
    digest = spec_digest_of(args[0])
    return scripts.store_result(result, None, meta.qid, "team", spec_digest=digest)


def _orphaned(r, settings: Settings) -> int:
    return int(r.hget(settings.keys.stats, "orphaned") or 0)


def test_a_result_of_other_code_than_its_record_names_is_refused(redis_url: str) -> None:
    with private_db(redis_url) as url:
        settings, r, scripts, team = _farm(url)
        team.submit([_spec("echo new")], None, all_or_nothing=True)
        # the old run (Redis lost its data meanwhile) ends after the resubmission
        assert not _stored_by_worker(scripts, _spec("echo old"), "old")
        assert not r.exists(settings.keys.result("team/x"))
        assert _orphaned(r, settings) == 1
        assert _stored_by_worker(scripts, _spec("echo new"), "new")
        assert team.results(["x"])["x"].message == "new"


def test_a_result_whose_record_redis_lost_is_dropped_and_its_id_runs_afresh(
    redis_url: str,
) -> None:
    with private_db(redis_url) as url:
        settings, r, scripts, team = _farm(url)
        team.submit([_spec("echo one")], None, all_or_nothing=True)
        r.flushdb()  # Redis restarted empty while the job ran
        team.tenants.add("team", Policy())  # the operator adds the team again
        assert not _stored_by_worker(scripts, _spec("echo one"), "one")
        assert not r.exists(settings.keys.result("team/x"))
        assert _orphaned(r, settings) == 1
        # its id, sent again with other code, is a new job: no stale verdict waits for it
        team.submit([_spec("echo other")], None, all_or_nothing=True)
        assert team.results(["x"]) == {}
        assert _stored_by_worker(scripts, _spec("echo other"), "other")
        assert team.results(["x"])["x"].message == "other"


def test_a_result_whose_tenant_and_record_are_gone_is_kept_by_no_one(redis_url: str) -> None:
    """A purge frees the name of a tenant whose jobs are not listed as dispatched; a job
    still running (its dispatch entry expired, or lost) stored its result after, and a
    new team given the name read it (left by the review of stop 38), before the name
    was taken again or after (a review of the first fix, which wrote the record back
    once a tenant of the name existed: the newcomer read it, and lost the id)."""
    with private_db(redis_url) as url:
        settings, r, scripts, team = _farm(url)
        team.submit([_spec("echo secret")], None, all_or_nothing=True)
        team.tenants.remove("team", scripts, purge=True)  # its waiting job cancelled
        assert not _stored_by_worker(scripts, _spec("echo secret"), "SECRET")
        newcomer = TenantJobs(r, settings, "team")
        newcomer.tenants.add("team", Policy())
        assert not _stored_by_worker(scripts, _spec("echo secret"), "SECRET")  # and after
        assert _orphaned(r, settings) == 2
        assert newcomer.results(["x"]) == {}
        newcomer.submit([_spec("echo mine")], None, all_or_nothing=True)  # the id is free
