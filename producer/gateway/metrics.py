"""The gateway's own metrics: request latency by route template and status code.

The route is the template ("/v1/jobs/{job_id}"), never the raw path: no job id or
tenant becomes a label, so the series stay bounded. Each gateway process counts its own
requests (a process per replica; with uvicorn --workers > 1 a scrape sees one of them).
The endpoint needs SANDFARM_METRICS_TOKEN as a bearer token and is off without one: it
faces tenants, and the farm's traffic is the operator's business.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest

from producer.gateway import problems
from producer.metrics.server import token_ok

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
# long-polls wait up to 60 s: the buckets reach past that
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 90.0)
UNMATCHED = "unmatched"  # a path no route serves (404s of scanners): one label, not many


# The method is the client's to choose (h11 takes any token): a fixed set keeps the
# label's cardinality bounded however many methods a client invents.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def method_label(scope: Mapping[str, Any]) -> str:
    method = str(scope.get("method", ""))
    return method if method in METHODS else "other"


class RequestMetrics:
    """ASGI middleware timing each HTTP request to its last response byte."""

    def __init__(self, app: Callable[..., Awaitable[None]], histogram: Histogram) -> None:
        self.app = app
        self.histogram = histogram

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        code = ["500"]  # the app raised before it answered

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                code[0] = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or UNMATCHED
            self.histogram.labels(template, method_label(scope), code[0]).observe(
                time.perf_counter() - started
            )


def install(app: FastAPI, token: str) -> None:
    """Count every request; serve /metrics to whoever holds ``token`` (404 without one)."""
    registry = CollectorRegistry(auto_describe=False)
    histogram = Histogram(
        "sandfarm_gateway_request_seconds",
        "Gateway request latency (s), by route template, method and status code",
        ["route", "method", "code"],
        buckets=BUCKETS,
        registry=registry,
    )

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        if not token:
            raise problems.ProblemError(
                404, "not-found", "Not found", "metrics are off: set SANDFARM_METRICS_TOKEN"
            )
        if not token_ok(request.headers.get("authorization"), token):
            raise problems.ProblemError(
                401,
                "unauthorized",
                "Unauthorized",
                "metrics need Authorization: Bearer <SANDFARM_METRICS_TOKEN>",
                headers={"WWW-Authenticate": 'Bearer realm="sandfarm-metrics"'},
            )
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(RequestMetrics, histogram=histogram)
