"""The tenants' API, /v1: submit, read, wait for, list and cancel jobs; usage and quotas.

Handlers are plain (synchronous) functions: FastAPI runs them in its thread pool, and
they share the one Redis code path with the trusted FarmClient (producer.jobs).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import redis
from fastapi import APIRouter, Body, Depends, Path, Query

from producer.gateway.context import Caller, caller
from producer.gateway.problems import ProblemError, problems
from producer.gateway.schemas import (
    MAX_IDS_PER_REQUEST,
    MAX_WAIT_S,
    Accepted,
    Cancelled,
    CancelRequest,
    JobList,
    JobPage,
    JobProgress,
    JobSummary,
    Results,
    ResultsRequest,
    SpecHashes,
    SpecHashesRequest,
    Usage,
)
from producer.protocol import IdConflictError, QuotaError, TenantError
from producer.protocol.ids import random_hex_id
from producer.protocol.scripts import utc_day
from sandbox_core import JobResult, JobSpec, Status
from sandbox_core.errors import PolicyError, SpecError

router = APIRouter(prefix="/v1")
Who = Annotated[Caller, Depends(caller)]
JobId = Annotated[str, Path(max_length=128, description="the job's id (its tenant's own)")]
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")
# A wait on /results without a completion list polls Redis: first after POLL_FIRST_S,
# then each pause twice the last, up to POLL_MOST_S (a client that wants each result at
# once names itself, Sandfarm-Client, and waits on its list instead).
POLL_FIRST_S, POLL_MOST_S = 0.2, 2.0
ONE_JOB: dict[str, Any] = {
    "code": {"summary": "Python", "value": {"id": "hello-1", "code": "print('hello')"}},
    "steps": {
        "summary": "Steps, with limits",
        "value": {
            "id": "steps-1",
            "steps": [
                {"kind": "write_file", "path": "a.txt", "content": "hi"},
                {"kind": "bash", "command": "cat a.txt; exit 3", "check": False},
            ],
            "limits": {"timeout_s": 2, "memory_mb": 128},
        },
    },
}
JOBS: dict[str, Any] = {
    "two": {
        "summary": "Two jobs",
        "value": {"jobs": [{"id": "b-1", "code": "print(1)"}, {"id": "b-2", "command": "true"}]},
    }
}
# After the first announcement, gather more for up to LINGER_S (fewer, fuller replies
# under load), but stop once none arrives for LINGER_GAP_S (a batch's tail, a lone job).
COMPLETIONS_LINGER_S = 0.2
COMPLETIONS_LINGER_GAP_S = 0.025
FULL_RETRY_AFTER_S = 30  # a full Redis frees room as results expire and jobs are taken
CURSOR_RE = re.compile(r"^[0-9]{1,12}(\.[0-9]{1,9})?~[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")


@contextmanager
def _translated() -> Iterator[None]:
    """The farm's errors as problems: 422 for a job a policy refuses, 409 for an id
    naming another job, 429 over a quota, 401 when the tenant went, 503 without Redis."""
    try:
        yield
    except (SpecError, PolicyError) as exc:
        field = getattr(exc, "field", None)
        raise ProblemError(422, "invalid", "Job refused", str(exc), field=field) from None
    except IdConflictError as exc:
        raise ProblemError(409, "conflict", "Id taken", str(exc), ids=exc.conflicts) from None
    except QuotaError as exc:
        retry = max(1, math.ceil(exc.retry_after_s))
        headers = {
            "Retry-After": str(retry),
            "RateLimit-Remaining": "0",
            "RateLimit-Reset": str(retry),
        }
        fewer = exc.fewer or None
        raise ProblemError(
            429, exc.reason, "Over quota", str(exc), headers=headers, fewer=fewer
        ) from None
    except TenantError as exc:
        raise ProblemError(401, "unauthorized", "Unauthorized", str(exc)) from None
    except redis.exceptions.OutOfMemoryError:  # maxmemory, noeviction: nothing was written
        detail = "the farm's store is full (Redis maxmemory); nothing was taken, send it again"
        headers = {"Retry-After": str(FULL_RETRY_AFTER_S)}
        raise ProblemError(503, "full", "Unavailable", detail, headers=headers) from None
    except redis.RedisError:
        raise ProblemError(503, "unavailable", "Unavailable", "the farm's store is away") from None


def _named(specs: list[JobSpec]) -> list[JobSpec]:
    """Jobs without an id get one here (a client that wants safe retries sends its own)."""
    return [s if s.id else s.model_copy(update={"id": random_hex_id()}) for s in specs]


@router.post(
    "/jobs",
    status_code=202,
    response_model=Accepted,
    responses=problems(409, 415, 429),
    summary="Submit one job",
)
def submit_job(spec: Annotated[JobSpec, Body(openapi_examples=ONE_JOB)], who: Who) -> Accepted:
    with _translated():
        return Accepted(ids=who.jobs.submit(_named([spec]), who.done_key, all_or_nothing=True))


@router.post(
    "/jobs/batch",
    status_code=202,
    response_model=Accepted,
    responses=problems(409, 415, 429),
    summary="Submit up to 1,000 jobs: all are accepted, or none",
)
def submit_jobs(body: Annotated[JobList, Body(openapi_examples=JOBS)], who: Who) -> Accepted:
    specs = _named(body.jobs)
    seen: set[str] = set()
    for index, spec in enumerate(specs):
        assert spec.id is not None
        if spec.id in seen:
            detail = f"jobs.{index}.id: {spec.id!r} is given twice in this request"
            raise ProblemError(422, "invalid", "Invalid request", detail, field=f"jobs.{index}.id")
        seen.add(spec.id)
    with _translated():
        return Accepted(ids=who.jobs.submit(specs, who.done_key, all_or_nothing=True))


@router.get(
    "/jobs/{job_id}",
    response_model=JobResult | JobProgress,
    responses=problems(404),
    summary="A job's result, or where it is (wait: long-poll up to 60 s)",
)
def get_job(
    job_id: JobId, who: Who, wait: Annotated[float, Query(ge=0, le=60)] = 0.0
) -> JobResult | JobProgress:
    with _translated():
        state = who.jobs.state(job_id) if ID_RE.fullmatch(job_id) else "unknown"
        if state == "unknown":
            raise ProblemError(404, "not-found", "Not found", f"no job {job_id!r} here")
        found = who.jobs.result(job_id, timeout=wait) if state in ("queued", "running") else None
        if found is None and state in ("queued", "running"):
            now = who.jobs.state(job_id)
            if now in ("queued", "running"):
                return JobProgress(id=job_id, status="running" if now == "running" else "queued")
        return found or _final(who, job_id)


def _reply_bytes(who: Caller) -> int:
    """Stored result JSON one reply of many results carries at most (see the setting)."""
    return who.jobs.settings.gateway_max_reply_mb * 1024 * 1024


def _final(who: Caller, job_id: str) -> JobResult:
    found = who.jobs.result(job_id)
    if found is None:  # expired between the two reads
        raise ProblemError(404, "not-found", "Not found", f"no job {job_id!r} here")
    return found


@router.post(
    "/results",
    response_model=Results,
    responses=problems(415),
    summary="Many results at once; with wait, until at least one more is final",
)
def get_results(body: ResultsRequest, who: Who) -> Results:
    with _translated():
        asked = list(dict.fromkeys(body.ids))
        ids = [i for i in asked if ID_RE.fullmatch(i)]
        never = [i for i in asked if not ID_RE.fullmatch(i)]
        found, _ = who.jobs.results_within(ids, _reply_bytes(who))
        pending = [i for i in ids if i not in found]
        if pending and body.wait:  # only a job the farm holds can become final
            known = who.jobs.known(pending)
            never += [i for i in pending if i not in known]
            pending = [i for i in pending if i in known]
        deadline = time.monotonic() + body.wait
        pause = POLL_FIRST_S
        while pending and not found and time.monotonic() < deadline:
            left = deadline - time.monotonic()
            if who.done_key is not None:
                # Any announcement ends the wait: it may be of an id the client asks for
                # in another request, and the client polls again at once.
                if not who.jobs.done(who.done_key, None, min(left, 5.0), MAX_IDS_PER_REQUEST):
                    continue
                found, _ = who.jobs.results_within(pending, _reply_bytes(who))
                pending = [i for i in pending if i not in found]
                break
            time.sleep(min(left, pause))
            pause = min(2 * pause, POLL_MOST_S)  # each poll reads every id from Redis
            found, _ = who.jobs.results_within(pending, _reply_bytes(who))
            pending = [i for i in pending if i not in found]
        # final but over the reply's bound: stored, so known, and listed pending
        known = who.jobs.known(pending) if pending else set()
        return Results(
            results=list(found.values()),
            pending=[i for i in pending if i in known],
            unknown=never + [i for i in pending if i not in known],
        )


@router.get(
    "/completions",
    response_model=Results,
    responses=problems(),
    summary="The results announced on this client's completion list since it last asked",
    description="Needs the Sandfarm-Client header (the list is the client's, named by it):"
    " each result is handed out once; jobs submitted by another client are not announced"
    " here (ask /v1/results for them).",
)
def completions(
    who: Who,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
    limit: Annotated[int, Query(ge=1, le=MAX_IDS_PER_REQUEST)] = MAX_IDS_PER_REQUEST,
) -> Results:
    if who.done_key is None:
        detail = "send Sandfarm-Client: <your client's name> to have a completion list"
        raise ProblemError(422, "invalid", "Invalid request", detail, field="Sandfarm-Client")
    with _translated():
        ids = who.jobs.done(who.done_key, None, wait, limit)
        until = time.monotonic() + COMPLETIONS_LINGER_S
        while ids and len(ids) < limit and (left := until - time.monotonic()) > 0:
            more = who.jobs.done(
                who.done_key, None, min(COMPLETIONS_LINGER_GAP_S, left), limit - len(ids)
            )
            if not more:
                break
            ids += more
        found, withheld = who.jobs.results_within(ids, _reply_bytes(who))
        try:
            who.jobs.give_back(who.done_key, withheld)  # announced again: the next ask has them
        except redis.exceptions.OutOfMemoryError:  # a full Redis: named instead, never lost
            return Results(results=list(found.values()), pending=list(withheld), unknown=[])
    return Results(results=list(found.values()), pending=[], unknown=[])


@router.get(
    "/jobs",
    response_model=JobPage,
    responses=problems(),
    summary="This tenant's jobs, newest first",
)
def list_jobs(
    who: Who,
    status: Status | None = None,
    label: Annotated[str | None, Query(description="key=value", pattern=r"^[^=]+=.*$")] = None,
    cursor: Annotated[
        str | None, Query(pattern=CURSOR_RE.pattern, description="`next` of the page before")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> JobPage:
    with _translated():
        pair = tuple(label.split("=", 1)) if label else None
        after = None
        if cursor:
            at, _, last = cursor.partition("~")
            after = (float(at), last)
        jobs, more = who.jobs.listing(
            after,
            limit,
            status.value if status else None,
            pair,  # type: ignore[arg-type]
        )
    summaries = [JobSummary.model_validate(job) for job in jobs]
    return JobPage(jobs=summaries, next=None if more is None else f"{more[0]!r}~{more[1]}")


@router.post(
    "/jobs/{job_id}/cancel",
    response_model=Cancelled,
    responses=problems(404),
    summary="Cancel one job",
)
def cancel_job(job_id: JobId, who: Who) -> Cancelled:
    with _translated():
        if not ID_RE.fullmatch(job_id) or who.jobs.state(job_id) == "unknown":
            raise ProblemError(404, "not-found", "Not found", f"no job {job_id!r} here")
        done = who.jobs.cancel(job_id)
    return Cancelled(cancelled=[job_id] if done else [], not_cancelled=[] if done else [job_id])


@router.post(
    "/jobs/cancel", response_model=Cancelled, responses=problems(415), summary="Cancel jobs"
)
def cancel_jobs(body: CancelRequest, who: Who) -> Cancelled:
    with _translated():
        done = {i: ID_RE.fullmatch(i) is not None and who.jobs.cancel(i) for i in body.ids}
    return Cancelled(
        cancelled=[i for i, ok in done.items() if ok],
        not_cancelled=[i for i, ok in done.items() if not ok],
    )


@router.post(
    "/jobs/specs",
    response_model=SpecHashes,
    responses=problems(415),
    summary="The spec hash each id names (how a client tells an edited job from a done one)",
)
def spec_hashes(body: SpecHashesRequest, who: Who) -> SpecHashes:
    with _translated():
        ids = [i for i in body.ids if ID_RE.fullmatch(i)]
        return SpecHashes(hashes=who.jobs.known_hashes(ids))


@router.get("/usage", response_model=Usage, responses=problems(), summary="Usage and quotas")
def usage(who: Who) -> Usage:
    with _translated():
        jobs = who.jobs
        policy = jobs.policy()
        today = datetime.now(UTC)
        days = [utc_day(today - timedelta(days=n)) for n in range(7)]
        pipe = jobs.redis.pipeline(transaction=False)
        for day in days:
            pipe.hgetall(jobs.keys.usage(who.tenant, day))
        pipe.llen(jobs.keys.pending(who.tenant))
        pipe.zcard(jobs.keys.active(who.tenant))
        *counters, waiting, dispatched = pipe.execute()
    by_day = {day: _numbers(raw) for day, raw in zip(days, counters, strict=True) if raw}
    return Usage(
        tenant=who.tenant,
        policy=policy,
        waiting=waiting,
        dispatched=dispatched,
        today=by_day.get(days[0], {}),
        days=by_day,
    )


def _numbers(raw: dict[bytes, bytes]) -> dict[str, float]:
    return {k.decode(): float(v) for k, v in raw.items()}
