"""The producer's minimal Celery app: broker configuration only, no tasks imported.

Jobs are sent by task name (``sandfarm.execute``); the producer never imports worker
code. The broker half of the configuration is the same function the worker uses.
"""

from __future__ import annotations

from celery import Celery

from producer.protocol import Settings, broker_config, get_settings


def make_app(settings: Settings) -> Celery:
    app = Celery("sandfarm-producer", set_as_current=False)
    app.conf.update(broker_config(settings))
    # Sent events double the Redis writes per job; on only where Flower must see queued jobs.
    app.conf.task_send_sent_event = settings.sent_events
    return app


def __getattr__(name: str) -> Celery:
    # `celery -A producer.celery_app flower` finds `app` here: broker settings only.
    if name == "app":
        globals()["app"] = make_app(get_settings())
        return globals()["app"]
    raise AttributeError(name)
