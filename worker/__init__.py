"""The sandbox worker: Celery app, execute task, slots, reaper."""
