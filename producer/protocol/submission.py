"""A job on its way in: its compact wire form, its content hash, its state record and its
Celery message, and the one admission step (submit_jobs.lua) that takes or refuses it.
Shared by the trusted FarmClient and the tenants' gateway, so both submit alike."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic_core import to_json

from producer.protocol import margins
from producer.protocol.broker import TASK_NAME
from producer.protocol.errors import IdConflictError, QuotaError
from producer.protocol.messages import json_text, task_message
from producer.protocol.records import MessageMeta, spec_hash
from producer.protocol.result_budget import admission_charge
from producer.protocol.scripts import FarmScripts, Submission, utc_day
from producer.protocol.tenants import MIB, Policy, qualified
from sandbox_core import JobSpec, Limits

_DEFAULT_LIMITS = Limits().model_dump(mode="json")


def compact_spec(spec: JobSpec) -> dict[str, Any]:
    """The spec as a small JSON dict: defaults that need no saying are left out."""
    data = spec.model_dump(mode="json", exclude_none=True)
    for name in ("files", "env", "collect", "labels"):
        if not data.get(name):
            data.pop(name, None)
    if not data.get("stop_on_error"):
        data.pop("stop_on_error", None)
    for step in data.get("steps", []):
        if step.get("check") is True:
            step.pop("check")
    limits = {k: v for k, v in data.get("limits", {}).items() if _DEFAULT_LIMITS.get(k) != v}
    if limits:
        data["limits"] = limits
    else:
        data.pop("limits", None)
    return data


@dataclass(frozen=True)
class Prepared:
    """A job ready for submit_jobs, with the hash its id will be held to."""

    job_id: str
    submission: Submission
    day: str  # the UTC day its result-budget charge counts on (JobState.at's)


@dataclass(frozen=True)
class _Call:
    """What every job of one submit call shares, serialised once: each job's state record
    and message repeat it. Built per job through the models (and utc_day's strftime), it
    was a sixth of the client's time per job (RESULTS.md, 2026-12-04 afternoon)."""

    tenant: str
    policy: Policy
    notify: str | None
    queue: str
    prefix: str
    day: str  # the UTC day of ``now``, the charges' day
    state_at: str  # JobState's fields from "at" to "spec" (its "notify" or none), as JSON
    meta: dict[str, Any]  # MessageMeta as JSON types, every field but the id


def _call(
    tenant: str, policy: Policy, notify: str | None, queue: str, now: datetime, prefix: str
) -> _Call:
    meta = MessageMeta(id="", tenant=tenant, ttl=policy.result_ttl_s, queued_at=now, notify=notify)
    shared = meta.model_dump(mode="json", exclude_none=True)
    del shared["id"]
    state_at = f',"at":{json_text(now)}'
    if notify is not None:  # JobState leaves a None out
        # strict, as JobState's dump: a lone surrogate is refused here, not stored escaped
        state_at += f',"notify":{to_json(notify).decode()}'
    return _Call(tenant, policy, notify, queue, prefix, utc_day(now), state_at, shared)


def _state(call: _Call, kept: int, digest: str, slot_s: float) -> str:
    """JobState(kept, at, notify, spec, slot_s).dump(), written directly (the unit tests
    hold the two equal): ``digest`` is hex, the rest is JSON already; a timeout that is
    not finite is null, as the model writes it (dispatch then charges the floor)."""
    slot = json_text(float(slot_s)) if math.isfinite(slot_s) else "null"
    return f'{{"kept":{int(kept)}{call.state_at},"spec":"{digest}","slot_s":{slot}}}'


def _prepare_one(spec: JobSpec, call: _Call) -> Prepared:
    assert spec.id is not None
    compact = compact_spec(spec)
    digest = spec_hash(compact)
    qid = qualified(call.tenant, spec.id)
    message = task_message(
        TASK_NAME,
        qid,
        [compact, {"id": spec.id, **call.meta}],
        call.queue,
        argsrepr=spec.summary(call.tenant),  # Flower and logs see this summary, never the code
        time_limit=spec.limits.timeout_s + margins.HARD_LIMIT_MARGIN_S,
        soft_time_limit=spec.limits.timeout_s + margins.SOFT_LIMIT_MARGIN_S,
    )
    budget_mb = call.policy.result_mb_per_day
    kept = admission_charge(spec.id, spec.labels, qid, call.prefix, call.notify, budget_mb)
    # its charge counts on the day of ``now`` (submit() passes that day to the script)
    state = _state(call, kept, digest, spec.limits.timeout_s)
    return Prepared(spec.id, Submission(qid, digest, state, message), call.day)


def prepare_all(
    specs: Sequence[JobSpec],
    tenant: str,
    policy: Policy,
    notify: str | None,
    queue: str,
    now: datetime,
    prefix: str,
) -> list[Prepared]:
    """``specs`` (each with an id) ready for submit(), queued at ``now``."""
    call = _call(tenant, policy, notify, queue, now, prefix)
    return [_prepare_one(spec, call) for spec in specs]


def submit(
    scripts: FarmScripts,
    tenant: str,
    policy: Policy,
    jobs: Sequence[Prepared],
    *,
    all_or_nothing: bool,
) -> list[str]:
    """Admit ``jobs`` (then dispatch what fits); returns their ids, in order.

    Raises QuotaError (nothing taken) over the tenant's rate, queue (jobs or bytes) or
    budgets (CPU, result bytes), and
    IdConflictError for ids that name another spec: with ``all_or_nothing`` nothing is
    taken then; without, the others are (its ``submitted`` lists them)."""
    budget = policy.cpu_budget_s_per_day
    # jobs prepared together name one day; their charges are counted in it
    day = jobs[0].day if jobs else utc_day()
    admitted = scripts.submit_jobs(
        tenant,
        [job.submission for job in jobs],
        ttl=policy.result_ttl_s,
        all_or_nothing=all_or_nothing,
        max_queued=policy.max_queued,
        bucket=policy.bucket,
        cpu_budget_ms=None if budget is None else budget * 1000,
        max_queued_bytes=policy.max_queued_mb * MIB,
        result_bytes_budget=policy.result_mb_per_day * MIB,
        day=day,
    )
    ids = [job.job_id for job in jobs]
    if admitted.refusal == "conflict":
        conflicts = [ids[int(i)] for i in admitted.detail]
        raise IdConflictError(conflicts, [])
    if admitted.refusal is not None:
        raise _quota_error(tenant, policy, admitted.refusal, admitted.detail, len(jobs))
    conflicts = [i for i, code in zip(ids, admitted.codes, strict=True) if code == "conflict"]
    if conflicts:
        accepted = [i for i, code in zip(ids, admitted.codes, strict=True) if code != "conflict"]
        raise IdConflictError(conflicts, accepted)
    return ids


def _quota_error(
    tenant: str, policy: Policy, reason: str, detail: tuple[Any, ...], count: int
) -> QuotaError:
    if reason == "rate":
        wait = int(detail[0]) / 1000
        new = int(detail[1]) if len(detail) > 1 else count  # the ids it knows take no token
        rate, burst = policy.bucket or (0.0, 0.0)
        if new > burst:
            message = f"{new} new jobs at once is over the burst of {burst:g}: send fewer per call"
            return QuotaError(tenant, reason, message, max(wait, 0.001), fewer=True)
        return QuotaError(tenant, reason, f"over the rate of {rate:g} jobs/s", max(wait, 0.001))
    if reason == "queue_full":
        waiting, cap = int(detail[0]), int(detail[1])
        new = int(detail[2]) if len(detail) > 2 else 0
        if new > cap:  # waiting cannot help: a smaller call can
            message = f"these {new} new jobs alone are over max_queued {cap}: send fewer per call"
            return QuotaError(tenant, reason, message, 1.0, fewer=True)
        return QuotaError(tenant, reason, f"{waiting} jobs wait already (max_queued {cap})", 1.0)
    if reason == "queue_bytes":
        held, adding, cap = (int(v) for v in detail[:3])
        if adding > cap:  # waiting cannot help: a smaller call can
            message = (
                f"these {count} jobs hold {adding / MIB:.1f} MiB alone, over max_queued_mb"
                f" {cap // MIB}: send fewer or smaller jobs per call"
            )
            return QuotaError(tenant, reason, message, 1.0, fewer=True)
        message = (
            f"the jobs waiting hold {held / MIB:.1f} MiB already and these"
            f" {adding / MIB:.1f} MiB more (max_queued_mb {cap // MIB})"
        )
        return QuotaError(tenant, reason, message, 1.0)
    seconds = float(detail[0]) if detail else 3600.0
    if len(detail) > 1 and detail[1] == "result_bytes":
        return _result_budget_error(tenant, policy, detail, count, seconds)
    used = policy.cpu_budget_s_per_day or 0
    return QuotaError(tenant, reason, f"today's CPU budget of {used:g} s is spent", seconds)


def _result_budget_error(
    tenant: str, policy: Policy, detail: tuple[Any, ...], count: int, seconds: float
) -> QuotaError:
    cap = policy.result_mb_per_day
    counted, charge, least = (int(v) for v in detail[2:5])
    left = max(0, cap * MIB - counted)
    need = f"the results of these {count} jobs keep {charge / MIB:.2f} MiB at the least (ids,"
    if charge > cap * MIB:  # tomorrow cannot help: a smaller call can
        message = (
            f"{need} labels), over the result budget of {cap} MiB a day (result_mb_per_day)"
            " alone: send fewer per call"
        )
        return QuotaError(tenant, "budget", message, 1.0, fewer=True)
    if least <= left:  # some of them fit today
        message = (
            f"{need} labels), and {left / MIB:.2f} MiB of today's result budget ({cap} MiB,"
            " result_mb_per_day) is left: send fewer per call"
        )
        return QuotaError(tenant, "budget", message, 1.0, fewer=True)
    message = (
        f"today's result budget of {cap} MiB (result_mb_per_day) is stored already, or held"
        " for the results of jobs admitted today"
    )
    return QuotaError(tenant, "budget", message, seconds)


def utc_now() -> datetime:
    return datetime.now(UTC)
