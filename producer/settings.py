"""Farm settings: every one has a default and a ``SANDFARM_<NAME>`` environment variable.

Shared by the producer and the worker (the worker imports this module; the producer
never imports worker code). ``Settings.table()`` renders the README table.
"""

from __future__ import annotations

from functools import cached_property

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sandbox_core import defaults as d

# Added to the farm's longest job so a message of a job still running is never
# considered lost: slot wait + workspace setup + result storage fit in this margin.
VISIBILITY_MARGIN_S = 300.0
TASK_NAME = "sandfarm.execute"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SANDFARM_", extra="ignore")

    redis_url: str = Field(
        "redis://127.0.0.1:6379/0", description="broker, job state and results (one Redis)"
    )
    queue: str = Field("sandfarm", description="the Celery queue jobs go through")
    key_prefix: str = Field("sandfarm:", description="prefix of every key sandfarm itself writes")
    visibility_timeout_s: float | None = Field(
        None,
        gt=0,
        description="seconds before an unacked job is redelivered; default: the longest"
        f" job ({d.TIMEOUT_S[1]:g}s) + {VISIBILITY_MARGIN_S:g}s",
    )
    result_ttl_s: int = Field(7 * 24 * 3600, ge=60, description="lifetime of results and job state")
    max_attempts: int = Field(
        3, ge=1, description="deliveries of one job before it ends `error` (worker deaths)"
    )
    default_backend: str = Field("process", description="backend for jobs that name none")
    concurrency: int = Field(2, ge=1, description="sandbox slots (pool processes) per worker")
    slot_base: int | None = Field(
        None,
        ge=0,
        description="first slot of this worker; default: the highest free block on the host",
    )
    reaper_interval_s: float = Field(
        5.0, gt=0, description="how often a worker sweeps slots that dead workers left"
    )
    cancel_poll_s: float = Field(0.25, gt=0, description="how often a running job checks cancel")
    restore_interval_s: float = Field(
        0.0,
        ge=0,
        description="seconds between scans for lost (unacked) jobs; default: visibility/4, 1..10s",
    )
    done_max_len: int = Field(
        1_000_000, ge=1000, description="cap of a client's completion list (oldest dropped)"
    )
    allow_network: bool = Field(
        False,
        description="let jobs ask for `limits.network` (process/bwrap: the host network,"
        " broker included; docker: a bridge)",
    )
    allow_weaker: bool = Field(
        False, description="run jobs even where a backend protection is missing (tests only)"
    )
    sent_events: bool = Field(
        False,
        description="producers also emit task-sent events (Flower shows queued jobs; slower"
        " enqueue)",
    )
    prefetch_multiplier: int = Field(
        1,
        ge=1,
        description="messages a worker holds per slot (1: no job waits behind another's)",
    )
    task_events: bool = Field(True, description="workers send task events (Flower needs them)")
    flower_port: int = Field(5555, description="`sandfarm flower` port")
    docker_image: str = Field(
        "sandfarm/sandbox:latest", description="docker backend: default (and allowed) image"
    )
    docker_runtime: str = Field(
        "runc", description="docker backend: OCI runtime (`runsc` for gVisor)"
    )
    docker_warm_pool: int = Field(
        2, ge=0, description="docker backend: started containers kept ready per pool process"
    )

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if not self.key_prefix:
            raise ValueError("key_prefix must not be empty")
        return self

    @property
    def visibility_timeout(self) -> float:
        if self.visibility_timeout_s is not None:
            return self.visibility_timeout_s
        return d.TIMEOUT_S[1] + VISIBILITY_MARGIN_S

    @property
    def restore_interval(self) -> float:
        if self.restore_interval_s:
            return self.restore_interval_s
        return min(10.0, max(1.0, self.visibility_timeout / 4))

    @property
    def hard_time_limit_s(self) -> float:
        """Celery's hard limit: above the sandbox's own longest job, below visibility."""
        return d.TIMEOUT_S[1] + VISIBILITY_MARGIN_S / 2

    @cached_property
    def keys(self) -> Keys:
        return Keys(self.key_prefix)

    @classmethod
    def table(cls) -> str:
        """The settings as a Markdown table (for the README)."""
        rows = ["| variable | default | meaning |", "|---|---|---|"]
        for name, field in cls.model_fields.items():
            default = "" if field.default is None else f"`{field.default}`"
            rows.append(f"| `SANDFARM_{name.upper()}` | {default} | {field.description} |")
        return "\n".join(rows)


class Keys:
    """Every Redis key sandfarm writes (the Celery broker keys are kombu's own)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def job(self, job_id: str) -> str:  # submission state (idempotency), TTL
        return f"{self.prefix}job:{job_id}"

    def result(self, job_id: str) -> str:  # the bounded JobResult JSON, TTL, SET NX
        return f"{self.prefix}result:{job_id}"

    def attempts(self, job_id: str) -> str:  # deliveries so far, TTL
        return f"{self.prefix}attempts:{job_id}"

    def cancel(self, job_id: str) -> str:  # present: the client asked to cancel, TTL
        return f"{self.prefix}cancel:{job_id}"

    def running(self, job_id: str) -> str:  # present while a sandbox runs the job, TTL
        return f"{self.prefix}running:{job_id}"

    def done(self, client_id: str) -> str:  # ids completed for one client, TTL + capped
        return f"{self.prefix}done:{client_id}"

    @property
    def duplicates(self) -> str:  # count of results a redelivery tried to store twice
        return f"{self.prefix}stats:duplicates"

    @property
    def in_flight(self) -> str:  # sorted set job id -> start time, for `status`
        return f"{self.prefix}inflight"

    @property
    def workers(self) -> str:  # hash worker name -> heartbeat JSON
        return f"{self.prefix}workers"


def broker_config(settings: Settings) -> dict[str, object]:
    """The broker half of the Celery configuration: identical for producers and workers."""
    return {
        "broker_url": settings.redis_url,
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
            "socket_timeout": 30,
            "socket_connect_timeout": 5,
            "health_check_interval": 10,
        },
        # Keep retrying the broker forever, at startup too: a restarted Redis comes back.
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
    }


def get_settings(**overrides: object) -> Settings:
    """Settings from the environment, with explicit (non-None) overrides on top."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
