"""Prometheus metrics: the farm's collector (from Redis) and its HTTP server; the
gateway's own request metrics live in producer.gateway.metrics."""

from __future__ import annotations

from producer.metrics.collector import FarmCollector
from producer.metrics.server import serve, token_ok

__all__ = ["FarmCollector", "serve", "token_ok"]
