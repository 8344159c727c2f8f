"""GatewayClient: the SDK over HTTP, for tenants (an API key, no Redis). The same
interface as FarmClient (producer.jobclient.JobClient), so the batch runner and the CLI
take either.

Every job gets its id on this side before it is sent, so a submission is idempotent: a
retry after a lost reply or a dead gateway (the client moves to the next URL it knows)
never submits twice. Over the tenant's rate it waits as long as the gateway's
Retry-After says, then sends again.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import httpx

from producer.protocol import AuthError, IdConflictError, JobsLostError, QuotaError
from producer.protocol.errors import FarmUnavailableError, send_each
from producer.protocol.ids import client_id as checked_client_id
from producer.protocol.ids import random_hex_id
from sandbox_core import JobResult, JobSpec, parse_spec
from sandbox_core.errors import PolicyError, SpecError

BATCH = 1000  # the gateway's most jobs (and ids) per request
WAIT_S = 20.0  # one long-poll for results
LOST_CHECK_S = 10.0  # while a wait is idle, look this often for jobs the farm forgot
TRIES = 8  # connection failures and 5xx answers before giving up
# A tenant's requests at the gateway's bound (429 too-many-requests) wait for a place as
# long as a long-poll may hold one, and a little more.
BUSY_WAIT_S = 75.0
BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0)
FULL_TRIES = 5  # a batch refused this often for a full queue goes in halves (it may
# be larger than the tenant's max_queued)


class GatewayClient:
    def __init__(
        self,
        url: str | Sequence[str],
        api_key: str,
        *,
        client_id: str | None = None,
        timeout_s: float = 90.0,
    ) -> None:
        self.urls = [url] if isinstance(url, str) else list(url)
        if not self.urls:
            raise SpecError("url", "give the gateway's URL")
        self.client_id = checked_client_id(client_id)  # the gateway's header rule
        headers = {"Authorization": f"Bearer {api_key}", "Sandfarm-Client": self.client_id}
        self.http = httpx.Client(headers=headers, timeout=timeout_s)
        self._current = 0

    # --- HTTP -----------------------------------------------------------------------

    def _url(self) -> str:
        """The gateway this client talks to now (it moves on when one fails)."""
        return self.urls[self._current % len(self.urls)]

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One call, retried on another gateway URL after a connection failure or 5xx,
        and after a wait while the tenant's other requests fill its places at the gateway
        (429 too-many-requests); every request here is safe to repeat (ids are ours)."""
        problem: str = ""
        busy_until = time.monotonic() + BUSY_WAIT_S
        attempt = 0
        while attempt < TRIES:
            base = self._url()
            try:
                response = self.http.request(method, base.rstrip("/") + path, **kwargs)
            except httpx.TransportError as exc:
                problem = f"{base}: {type(exc).__name__}: {exc}"
            else:
                if _busy(response) and time.monotonic() < busy_until:
                    # the tenant's other requests fill its places: this one waits its turn
                    time.sleep(float(response.headers.get("Retry-After", "1")))
                    continue
                if response.status_code < 500:
                    return response
                problem = f"{base}: HTTP {response.status_code}"
            self._current += 1
            time.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
            attempt += 1
        raise FarmUnavailableError(", ".join(self.urls), f"no gateway answers ({problem})")

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._request(method, path, **kwargs)
        if response.status_code >= 400:
            _raise(response)
        return response.json()

    # --- submission -----------------------------------------------------------------

    def submit(self, spec: JobSpec | dict[str, Any]) -> str:
        return self.submit_many([spec])[0]

    def submit_many(
        self, specs: Iterable[JobSpec | dict[str, Any]], batch: int = BATCH
    ) -> list[str]:
        """Enqueue jobs; returns their ids in order. IdConflictError (after the rest are
        sent) for ids that name another job; QuotaError only when waiting cannot help (its
        ``submitted`` lists the ids admitted before)."""
        ids: list[str] = []
        conflicts: list[str] = []
        chunk: list[dict[str, Any]] = []
        try:
            for item in specs:
                spec = item if isinstance(item, JobSpec) else parse_spec(item)
                if spec.id is None:
                    spec = spec.model_copy(update={"id": random_hex_id()})
                chunk.append(spec.model_dump(mode="json", exclude_none=True))
                if len(chunk) >= min(batch, BATCH):
                    self._send(chunk, ids, conflicts)
                    chunk = []
            if chunk:
                self._send(chunk, ids, conflicts)
        except QuotaError as exc:
            exc.submitted = list(ids)
            raise
        if conflicts:
            raise IdConflictError(conflicts, ids)
        return ids

    def _send(self, jobs: list[dict[str, Any]], ids: list[str], conflicts: list[str]) -> None:
        unique = list({job["id"]: job for job in jobs}.values())  # a repeated id: one job
        full = 0  # refusals for a full queue in a row
        while unique:
            response = self._request("POST", "/v1/jobs/batch", json={"jobs": unique})
            if response.status_code == 202:
                ids.extend(job["id"] for job in jobs if job["id"] not in conflicts)
                return
            if response.status_code == 409:  # all or nothing there: send the rest again
                taken = set(response.json().get("ids") or [])
                conflicts.extend(sorted(taken))
                unique = [job for job in unique if job["id"] not in taken]
                if not unique:
                    return
                continue
            if response.status_code == 429:
                error = _error(response)
                assert isinstance(error, QuotaError)
                full += error.reason in ("queue_full", "queue_bytes")
                if len(unique) > 1 and (error.fewer or full >= FULL_TRIES):
                    half = len(unique) // 2  # maybe more than could ever pass: in halves
                    send_each(
                        [unique[:half], unique[half:]], lambda p: self._send(p, ids, conflicts)
                    )
                    return
                if error.reason == "budget" or error.fewer:
                    raise error
                time.sleep(error.retry_after_s)
                continue
            _raise(response)

    # --- results --------------------------------------------------------------------

    def results(self, ids: Iterable[str], batch: int = BATCH) -> dict[str, JobResult]:
        return {r.id or "": r for r in self._each_result(ids, batch)}

    def _each_result(
        self, ids: Iterable[str], batch: int = BATCH, unknown: list[str] | None = None
    ) -> Iterator[JobResult]:
        """The final results among ``ids``, a reply at a time (each bounded by the
        gateway): a caller that takes them one by one never holds them all (a review);
        ``unknown`` gets the ids the farm has no record of."""
        ids, step = list(ids), min(batch, BATCH)
        for start in range(0, len(ids), step):  # a review: windows of BATCH overlapped
            reply = self._json("POST", "/v1/results", json={"ids": ids[start : start + step]})
            if unknown is not None:
                unknown += reply.get("unknown", ())
            results, reply["results"] = reply["results"], None
            for raw in results:
                yield JobResult.model_validate(raw)

    def result(self, job_id: str, timeout: float | None = None) -> JobResult | None:
        deadline = time.monotonic() + (timeout or 0)
        while True:
            wait = max(0.0, min(60.0, deadline - time.monotonic()))
            reply = self._json("GET", f"/v1/jobs/{job_id}", params={"wait": wait})
            if reply.get("status") not in ("queued", "running"):
                return JobResult.model_validate(reply)
            if time.monotonic() >= deadline:
                return None

    def state(self, job_id: str) -> str:
        response = self._request("GET", f"/v1/jobs/{job_id}")
        if response.status_code == 404:
            return "unknown"
        if response.status_code >= 400:
            _raise(response)
        return str(response.json()["status"])

    def known_hashes(self, ids: Sequence[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for start in range(0, len(ids), BATCH):
            part = list(ids[start : start + BATCH])
            found.update(self._json("POST", "/v1/jobs/specs", json={"ids": part})["hashes"])
        return found

    def as_completed(
        self,
        ids: Iterable[str],
        timeout: float | None = None,
        *,
        notice: Callable[[str], None] | None = None,
        rescan_s: float = 2.0,
    ) -> Iterator[JobResult]:
        """Each job's result once, as it finishes (those already final first), as
        FarmClient does: results announced on this client's completion list come back
        a batch per long-poll, so N jobs cost O(N / 1000) requests; ids announced
        elsewhere (another client, a resumed batch) are found by a rescan when the list
        is idle. Raises JobsLostError, as FarmClient does, once an idle rescan finds ids
        the farm has no record of (they would never finish). (``notice``: the farm's
        workers are not a tenant's to see.)"""
        pending = set(ids)
        deadline = None if timeout is None else time.monotonic() + timeout
        for result in self._each_result(list(pending)):
            pending.discard(result.id or "")
            yield result
        last_rescan = last_check = time.monotonic()
        while pending:
            left = WAIT_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{len(pending)} jobs not finished after {timeout:g}s")
            wait = round(max(0.01, min(WAIT_S, left)), 3)
            reply = self._json("GET", "/v1/completions", params={"wait": wait})
            given = [JobResult.model_validate(r) for r in reply["results"]]  # one reply
            named = [i for i in reply.get("pending", ()) if i in pending]  # not given back
            found = 0
            for result in itertools.chain(given, self._each_result(named)):
                if result.id in pending:
                    pending.discard(result.id or "")
                    found += 1
                    yield result
            if not found and time.monotonic() - last_rescan >= rescan_s:
                unknown: list[str] = []
                for result in self._each_result(list(pending), unknown=unknown):
                    if result.id in pending:
                        pending.discard(result.id or "")
                        found += 1
                        yield result
                last_rescan = time.monotonic()
                if not found and last_rescan - last_check >= LOST_CHECK_S:
                    if unknown:
                        raise JobsLostError(sorted(unknown), f"gateway {self._url()}")
                    last_check = last_rescan

    # --- control --------------------------------------------------------------------

    def cancel(self, job_id: str) -> bool:
        response = self._request("POST", f"/v1/jobs/{job_id}/cancel")
        if response.status_code == 404:
            return False
        if response.status_code >= 400:
            _raise(response)
        return bool(response.json()["cancelled"])

    def usage(self) -> dict[str, Any]:
        reply: dict[str, Any] = self._json("GET", "/v1/usage")
        return reply

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _error(response: httpx.Response) -> Exception:
    """The gateway's problem as the SDK's error (the same as FarmClient raises)."""
    try:
        problem = response.json()
    except ValueError:
        problem = {"detail": response.text[:200]}
    detail = str(problem.get("detail", ""))
    status = response.status_code
    if status == 409:
        return IdConflictError(list(problem.get("ids") or []), [])
    if status == 429:
        reason = str(problem.get("type", "")).rsplit("/", 1)[-1]
        retry = float(response.headers.get("Retry-After", "1"))
        # the detail is a QuotaError's text: "tenant 'name': what" (not said twice)
        named = re.fullmatch(r"tenant '([a-z0-9-]+)': (.*)", detail, re.DOTALL)
        tenant, detail = (named[1], named[2]) if named else ("(this tenant)", detail)
        return QuotaError(tenant, reason, detail, retry, fewer=bool(problem.get("fewer")))
    if status == 422:
        field = str(problem.get("field") or "job")
        reason = detail.removeprefix(f"{field}: ")
        return SpecError(field, reason) if "allowed" not in reason else PolicyError(field, reason)
    if status == 401:
        return AuthError(f"the gateway refused the API key: {detail}")
    return FarmUnavailableError(str(response.url), f"HTTP {status}: {detail}")


def _busy(response: httpx.Response) -> bool:
    """The gateway's 429 for a tenant at its bound of requests at once (not a quota)."""
    if response.status_code != 429:
        return False
    try:
        kind = str(response.json().get("type", ""))
    except ValueError:
        return False
    return kind.endswith("/too-many-requests")


def _raise(response: httpx.Response) -> None:
    raise _error(response)
