"""`sandfarm metrics`: the collector's /metrics over HTTP (one thread per scrape).

The series name every tenant (and how busy each is), so the collector is an operator's
endpoint: it binds loopback unless a bearer token (SANDFARM_METRICS_TOKEN) guards it.
"""

from __future__ import annotations

import hmac
import ipaddress
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from producer.metrics.bounded import REQUEST_TIMEOUT_S, BoundedServer
from producer.metrics.collector import FarmCollector
from producer.protocol import FarmError, Settings, connect


class MetricsExposedError(FarmError, PermissionError):
    """The collector was asked to listen beyond loopback without a token."""

    def __init__(self, host: str) -> None:
        self.host = host
        super().__init__(
            f"--host {host}: the farm's metrics name every tenant; listen beyond loopback"
            " only with SANDFARM_METRICS_TOKEN set (scrapers send it as a bearer token)"
        )


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_ok(header: str | None, token: str) -> bool:
    """Does an Authorization header carry ``token`` (no token configured: yes)?"""
    if not token:
        return True
    scheme, _, given = (header or "").partition(" ")
    # bytes: compare_digest refuses non-ASCII str, and headers arrive as latin-1
    offered = given.strip().encode("utf-8", "surrogateescape")
    return scheme.lower() == "bearer" and hmac.compare_digest(offered, token.encode())


def server(settings: Settings, host: str, port: int) -> ThreadingHTTPServer:
    if not settings.metrics_token and not loopback(host):
        raise MetricsExposedError(host)
    registry = CollectorRegistry(auto_describe=False)
    # impatient: a scrape while Redis is away answers sandfarm_redis_up 0 in seconds
    registry.register(FarmCollector(connect(settings.redis_url, patient=False), settings))
    token = settings.metrics_token

    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_S  # a connection that sends nothing is closed

        def do_GET(self) -> None:
            httpd.head_in(self.request)
            if self.path.split("?", 1)[0] != "/metrics":
                self._reply(404, b"not found: the metrics are at /metrics\n")
            elif not token_ok(self.headers.get("Authorization"), token):
                self._reply(401, b"unauthorized: send Authorization: Bearer <token>\n")
            else:
                self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)

        def _reply(self, code: int, body: bytes, kind: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            if code == 401:
                self.send_header("WWW-Authenticate", 'Bearer realm="sandfarm-metrics"')
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a scrape every few seconds is not news

    httpd = BoundedServer((host, port), Handler)
    return httpd


def serve(settings: Settings, host: str, port: int) -> None:
    httpd = server(settings, host, port)
    # as a container's pid 1, SIGTERM would be ignored without a handler of our own
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"sandfarm metrics: http://{host}:{port}/metrics", flush=True)
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()
