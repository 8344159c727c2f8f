"""The one task: ``sandfarm.execute`` — validate, count the attempt, run in this pool
process's slot, store the bounded JobResult once; then, while its chain has time, the
next dispatched jobs in the same slot (worker/chain.py).

Message: ``args = [spec_dict, meta]`` where meta is a ``protocol.MessageMeta`` (``notify``:
the completion list of the client that submitted it). The client has
already taken the job's state key, so a second submission never sends a second message;
a redelivered message (worker died, lost ack) finds the stored result and stops (or runs
the job its chain was running), or runs again and loses the SET NX race, which is
counted, never stored.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import redis
from celery import Task, signals
from celery.exceptions import Reject
from celery.worker.request import Request

from producer.protocol import TASK_NAME, LateStepError, MessageMeta
from sandbox_core import Status
from worker import events, jobs
from worker.app import app, settings
from worker.chain import Chain, from_message


@signals.worker_process_shutdown.connect
def _close_backends(**_: object) -> None:
    jobs.close_backends()


def _meta_of(raw: object) -> MessageMeta | None:
    try:
        return MessageMeta.model_validate(raw)
    except ValueError:
        return None


class ExecuteRequest(Request):
    """Flower and the logs show the backend that runs a job, never "default"."""

    @property
    def argsrepr(self) -> str:
        text = str(super().argsrepr)
        return text.replace("backend=default", f"backend={settings.default_backend}", 1)


class ExecuteTask(Task):  # Celery's Task is untyped (Any)
    Request = ExecuteRequest

    # The code never goes to Flower or logs (the producer also sends argsrepr).
    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        """A farm failure (a bug, Celery's hard time limit): store `error` for the job,
        and for the job its chain was running (a hard limit kills the whole chain)."""
        meta = _meta_of(args[1]) if len(args) > 1 else None
        if meta is None:
            return
        reason = f"farm failure: {type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):
            scripts = jobs.scripts()
            current = scripts.chain_of(meta.qid)
            if current is None:  # the message's own job (it may be final: counted then)
                result = jobs.final(meta.id, Status.ERROR, reason)
                digest = jobs.spec_digest_of(args[0])
                scripts.store_result(
                    result, meta.notify, meta.qid, meta.tenant, ttl=meta.ttl, spec_digest=digest
                )
                return
            # a chain's job was running (its message's own job is final)
            spec, held, _ = from_message(current[1], current[0])
            result = jobs.final(held.id, Status.ERROR, reason)
            digest = jobs.spec_digest_of(spec)
            scripts.store_result(
                result, held.notify, held.qid, held.tenant, ttl=held.ttl, spec_digest=digest
            )
            scripts.end_chain(meta.qid)


@app.task(name=TASK_NAME, bind=True, base=ExecuteTask, acks_late=True, reject_on_worker_lost=True)
def execute(self: Task, spec: dict[str, Any], raw_meta: dict[str, Any]) -> str:
    meta = MessageMeta.model_validate(raw_meta)
    chain = Chain(self.request, meta.qid)
    own = "already final"  # a redelivery after the result was stored, or a cancelled job
    try:
        job = chain.begin(spec, meta)
        while job is not None:
            clock = time.monotonic()
            try:
                result = jobs.run_job(job, chain.hostname)
            except Exception as exc:  # a farm bug: this job ends `error`, the chain goes on
                reason = f"farm failure: {type(exc).__name__}: {exc}"
                result = jobs.final(job.meta.id, Status.ERROR, reason, worker=chain.hostname)
            text = jobs.summary(result)
            stored, following = chain.finish(job, result, text)
            if job.meta.qid == meta.qid:
                own = jobs.summary(result, stored)
            else:
                ran = time.monotonic() - clock
                events.log_ran(job.meta.qid, TASK_NAME, ran, jobs.summary(result, stored))
            job = following
    except redis.RedisError as exc:
        # The job begun (or the one a chain took) may wait in Redis for a run that never
        # comes: the message must come back (unacked, or requeued) so that a redelivery
        # runs it (its attempt counted).
        raise Reject(f"the farm's Redis failed: {exc}", requeue=True) from exc
    except LateStepError as exc:
        # the job the chain took is begun and named by its record: the redelivered
        # message runs it, with a fresh clock (its attempt counted)
        raise Reject(str(exc), requeue=True) from exc
    return own
