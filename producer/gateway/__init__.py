"""The tenants' HTTP gateway (FastAPI on uvicorn): API keys, admission, quotas, the
tenant's own jobs only. Stateless: run any number of instances on one farm."""

from __future__ import annotations

from producer.gateway.app import create_app

__all__ = ["create_app"]
