"""Who gets into the gateway's handlers, decided before any of them takes a thread.

Handlers run in the gateway's THREADS threads, and a long-poll holds one for up to a
minute. Without a bound per tenant, one tenant's long-polls took every thread: every
other tenant's requests waited, its key check too (an attack review's finding). So here,
on the event loop, each /v1 request's API key is checked first (401 before its body is
read: an unknown caller makes the gateway hold nothing), then its tenant may have at
most ``per_tenant`` requests in the handlers at once (429 beyond, with Retry-After).
The key lookups have threads of their own, so a busy pool never holds them up.
"""

from __future__ import annotations

import redis
from anyio import CapacityLimiter, to_thread

from producer.gateway.asgi import App, Receive, Scope, Send, no_body
from producer.gateway.context import Farm, tenant_of
from producer.gateway.problems import TYPES, Problem, ProblemError, response

API_PREFIX = "/v1/"
LOOKUP_THREADS = 8
RETRY_AFTER_S = 1


class Admission:
    def __init__(self, app: App, farm: Farm, per_tenant: int) -> None:
        self.app = app
        self.farm = farm
        self.per_tenant = per_tenant
        self.in_flight: dict[str, int] = {}  # tenant -> its requests in the handlers now
        self.lookups: CapacityLimiter | None = None  # made in the event loop, on first use

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(API_PREFIX):
            await self.app(scope, receive, send)
            return
        if self.lookups is None:
            self.lookups = CapacityLimiter(LOOKUP_THREADS)
        header = dict(scope.get("headers") or []).get(b"authorization")
        authorization = header.decode("latin-1") if header is not None else None
        try:
            tenant = await to_thread.run_sync(
                tenant_of, self.farm, authorization, limiter=self.lookups
            )
        except ProblemError as exc:
            await self._answer(scope, send, exc.problem, exc.headers)
            return
        except redis.RedisError:
            detail = "the farm's store is away"
            problem = Problem(
                type=TYPES + "unavailable", title="Unavailable", status=503, detail=detail
            )
            await self._answer(scope, send, problem, {})
            return
        now = self.in_flight.get(tenant, 0)
        if now >= self.per_tenant:
            detail = (
                f"{now} requests of this tenant are in progress (at most {self.per_tenant}"
                " at once): wait for one to end"
            )
            problem = Problem(
                type=TYPES + "too-many-requests",
                title="Too many requests",
                status=429,
                detail=detail,
            )
            await self._answer(scope, send, problem, {"Retry-After": str(RETRY_AFTER_S)})
            return
        self.in_flight[tenant] = now + 1
        scope.setdefault("state", {})["tenant"] = tenant  # the handlers' caller() takes it
        try:
            await self.app(scope, receive, send)
        finally:
            left = self.in_flight[tenant] - 1
            if left:
                self.in_flight[tenant] = left
            else:
                del self.in_flight[tenant]

    @staticmethod
    async def _answer(scope: Scope, send: Send, problem: Problem, headers: dict[str, str]) -> None:
        await response(problem, {**headers, "Connection": "close"})(scope, no_body, send)
