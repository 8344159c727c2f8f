"""The broker half of the Celery configuration: identical for producers and workers, so
the visibility timeout and the serialiser can never differ between them."""

from __future__ import annotations

from producer.protocol import connection, urls
from producer.protocol.settings import Settings

TASK_NAME = "sandfarm.execute"


def broker_config(settings: Settings) -> dict[str, object]:
    # a sentinel:// URL becomes kombu's own form (one URL per sentinel) + master_name
    broker_url, sentinel = urls.kombu_broker(settings.redis_url)
    return {
        "broker_url": broker_url,
        # JSON only: a job is data, and pickle from a shared Redis would be code execution.
        "task_serializer": "json",
        "accept_content": ["json"],
        "event_serializer": "json",
        "result_accept_content": ["json"],
        # We keep our own bounded JobResult keys with a TTL; Celery's result backend
        # would store a second, unbounded copy per task and a key per task forever.
        "result_backend": None,
        "task_ignore_result": True,
        "task_default_queue": settings.queue,
        "broker_transport_options": {
            # One value everywhere, longer than the longest job, or a running job is
            # redelivered to a second worker.
            "visibility_timeout": settings.visibility_timeout,
            # Scan for messages of dead workers often enough for the visibility
            # timeout to be what decides how soon they come back...
            "unacked_restore_interval": settings.restore_interval,
            # ...and really scan on each of those ticks (kombu's default skips 9 in 10).
            "unacked_restore_throttle": 1,
            # A Redis that vanishes without closing the socket must not hang a publish.
            "socket_timeout": connection.SOCKET_TIMEOUT_S,
            "socket_connect_timeout": connection.CONNECT_TIMEOUT_S,
            "health_check_interval": connection.HEALTH_CHECK_S,
            **sentinel,
        },
        # Keep retrying the broker forever, at startup too: a restarted Redis comes back.
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
    }
