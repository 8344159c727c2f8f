"""The gateway app: stateless (everything lives in Redis), so any number of instances
serve the same farm. Each also dispatches now and then, so jobs move even when no
submission or finished job has just done it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from producer.gateway import metrics, problems
from producer.gateway.admission import API_PREFIX, Admission
from producer.gateway.asgi import App, Receive, Scope, Send, no_body
from producer.gateway.context import Farm, farm_of
from producer.gateway.routes import router
from producer.gateway.schemas import Health
from producer.protocol import FarmScripts, Settings, connect, get_settings

DISPATCH_EVERY_S = 1.0
MIN_BODY_RATE = 64 * 1024  # bytes a second a declared body may take, past the timeout
THREADS = 200  # handlers run in threads; long-polls hold one each


class BodyLimit:
    """Refuse a request body over ``limit`` bytes with 413, counted as it arrives (a
    client may lie in Content-Length, or send none). The body is read here, up to the
    limit, and handed on whole: the app would hold it all anyway to parse it."""

    def __init__(self, app: App, limit: int, timeout_s: float) -> None:
        self.app = app
        self.limit = limit
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Only the API takes bodies, and only its callers are known before one is read
        # (admission.py): any other path's body is left unread, never buffered (an attack
        # review: keyless 16 MiB bodies to /healthz grew a gateway 165 MB for 10).
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(API_PREFIX):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._answer(scope, send, 413)
            return
        chunks: list[bytes] = []
        seen = 0
        # A body trickled, or promised (Expect: 100-continue) and never sent, held its
        # request's slot and connection with no end (a review): it has timeout_s, and
        # as long again as a declared length takes at MIN_BODY_RATE (a big submission on
        # a slow link is not a trickle). Answers are sent outside the deadline's scope.
        size = int(declared) if declared is not None and declared.isdigit() else 0
        over = False
        with anyio.move_on_after(self.timeout_s + size / MIN_BODY_RATE) as late:
            while True:
                message = await receive()
                if message["type"] != "http.request":  # the client went away
                    return
                chunk = message.get("body", b"")
                seen += len(chunk)
                if seen > self.limit:
                    over = True
                    break
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        if over:
            await self._answer(scope, send, 413)
            return
        if late.cancelled_caught:
            await self._answer(scope, send, 408)
            return
        whole: MutableMapping[str, Any] = {"type": "http.request", "body": b"".join(chunks)}
        handed = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal handed
            if handed:
                return await receive()  # after the body: the disconnect, when it comes
            handed = True
            return whole

        await self.app(scope, replay, send)

    async def _answer(self, scope: Scope, send: Send, status: int) -> None:
        """413 (over the limit) or 408 (too slow), and the connection closed."""
        if status == 413:
            kind, title = "too-large", "Request too large"
            detail = f"the body is over {self.limit} bytes: send fewer or smaller jobs"
        else:
            kind, title = "timeout", "Request timeout"
            detail = f"the body did not come whole within {self.timeout_s:g} s"
        problem = problems.Problem(
            type=problems.TYPES + kind, title=title, status=status, detail=detail
        )
        response = problems.response(problem, {"Connection": "close"})
        await response(scope, no_body, send)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    farm = Farm(connect(settings.redis_url), settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = THREADS
        # readyz's ping has threads of its own: never behind the handlers'
        app.state.health_threads = anyio.CapacityLimiter(2)
        ticker = asyncio.create_task(_dispatching(farm))
        try:
            yield
        finally:
            ticker.cancel()
            farm.redis.close()

    app = FastAPI(
        title="sandfarm",
        version="1",
        summary="Run untrusted code in bounded sandboxes: the tenants' API",
        lifespan=lifespan,
    )
    app.state.farm = farm
    app.add_exception_handler(problems.ProblemError, problems.on_problem)
    app.add_exception_handler(RequestValidationError, problems.on_invalid)
    app.add_exception_handler(StarletteHTTPException, problems.on_http_error)
    app.include_router(router)

    @app.get("/healthz", response_model=Health, summary="The process is up")
    async def healthz() -> Health:
        return Health(status="ok")

    @app.get(
        "/readyz",
        response_model=Health,
        responses=problems.problems(503, api=False),
        summary="The farm's Redis answers",
    )
    async def readyz(request: Request) -> Health | JSONResponse:
        threads = request.app.state.health_threads
        try:
            await anyio.to_thread.run_sync(farm_of(request).redis.ping, limiter=threads)
        except Exception:
            return problems.response(
                problems.Problem(
                    type=problems.TYPES + "unavailable",
                    title="Unavailable",
                    status=503,
                    detail="the farm's store does not answer",
                )
            )
        return Health(status="ok")

    app.add_middleware(
        BodyLimit,
        limit=settings.gateway_max_body_mb * 1024 * 1024,
        timeout_s=settings.gateway_body_timeout_s,
    )
    # outside BodyLimit: a caller is known, and within its tenant's bound, before its body
    # is read
    app.add_middleware(Admission, farm=farm, per_tenant=settings.gateway_max_in_flight)
    metrics.install(app, settings.metrics_token)  # outermost: a 413 is timed too
    return app


async def _dispatching(farm: Farm) -> None:
    scripts = FarmScripts(farm.redis, farm.settings)
    while True:
        await asyncio.sleep(DISPATCH_EVERY_S)
        with contextlib.suppress(Exception):  # Redis away: the next tick tries again
            await anyio.to_thread.run_sync(scripts.dispatch)
