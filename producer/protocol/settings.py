"""Farm settings: every one has a default and a ``SANDFARM_<NAME>`` environment variable.

The one place producer, worker and gateway read their configuration from; the backends
get theirs as typed configs built here (``backend_config``), never from the environment.
``Settings.table()`` renders the README table (a test keeps the two in step).
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from producer.protocol import margins, urls
from producer.protocol.keys import Keys
from sandbox_core import defaults as d
from sandbox_core.backends import BACKEND_NAMES
from sandbox_core.backends.config import (
    BwrapConfig,
    DockerConfig,
    ProcessConfig,
    backend_config,
)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SANDFARM_", extra="ignore")

    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="broker, job state and results (one Redis): redis://, rediss://, unix://,"
        " or sentinel://host:port[,host:port...]/<master>[/<db>] (Redis Sentinel)",
    )
    queue: str = Field(
        "sandfarm",
        description="the Celery queue a worker consumes and its dispatch fills (jobs wait in"
        " per-tenant queues first: any worker of the farm takes any job; a separate farm needs"
        " its own SANDFARM_KEY_PREFIX or Redis DB)",
    )
    key_prefix: str = Field("sandfarm:", description="prefix of every key sandfarm itself writes")
    visibility_timeout_s: float | None = Field(
        None,
        gt=0,
        description="seconds before an unacked job is redelivered; default: the longest"
        f" job ({margins.LONGEST_JOB_S:g}s) + {margins.VISIBILITY_MARGIN_S:g}s",
    )
    result_ttl_s: int = Field(
        7 * 24 * 3600, ge=60, le=90 * 24 * 3600, description="lifetime of results and job state"
    )
    max_attempts: int = Field(
        3, ge=1, description="deliveries of one job before it ends `error` (worker deaths)"
    )
    default_backend: str = Field("process", description="backend for jobs that name none")
    backends: str = Field(
        "process,bwrap,docker",
        description="backends a worker serves, comma-separated (a job naming another is"
        " rejected at once)",
    )
    concurrency: int = Field(2, ge=1, description="sandbox slots (pool processes) per worker")
    slot_base: int | None = Field(
        None,
        ge=0,
        description="first slot of this worker (it takes concurrency slots, twice that with"
        " prewarm's spares); default: the highest free block on the host",
    )
    reaper_interval_s: float = Field(
        5.0, gt=0, description="how often a worker sweeps slots that dead workers left"
    )
    worker_lost_s: float = Field(
        60.0,
        ge=1,
        description="seconds without a heartbeat after which other workers send a worker's"
        " begun jobs again (its host lost with its reaper; never before its heartbeat is"
        " stale); one only cut off from Redis that long runs them too (a duplicate)",
    )
    cancel_poll_s: float = Field(0.25, gt=0, description="how often a running job checks cancel")
    restore_interval_s: float = Field(
        0.0,
        ge=0,
        description="seconds between scans for lost (unacked) jobs; default: visibility/4, 1..10s",
    )
    client_tenant: str = Field(
        "trusted",
        pattern=r"^[a-z0-9][a-z0-9-]{0,31}$",
        description="the tenant the trusted SDK and CLI (FarmClient) submit as, through the"
        " same fair-share queues as everyone (made, if missing, with max_queued 1,000,000,"
        " max_queued_mb 4096, result_mb_per_day 16384)",
    )
    dispatch_margin: int = Field(
        2,
        ge=0,
        description="jobs dispatched beyond the online slots (the Celery queue stays this"
        " short, so fair share decides late)",
    )
    gateway_max_body_mb: int = Field(
        16, ge=1, le=1024, description="the gateway refuses request bodies over this (413)"
    )
    gateway_max_reply_mb: int = Field(
        64,
        ge=1,
        le=4096,
        description="result JSON one reply of many results carries at most (the first"
        " always comes; the rest are listed pending: ask again)",
    )
    gateway_max_in_flight: int = Field(
        32,
        ge=1,
        le=10_000,
        description="requests of one tenant the gateway serves at once (429 beyond)",
    )
    gateway_max_connections: int = Field(
        4096,
        ge=16,
        le=1_000_000,
        description="connections one gateway process holds open at once: more are closed as"
        " they come (below its descriptor limit, which a flood of idle ones used up)",
    )
    gateway_max_connections_per_client: int = Field(
        256,
        ge=1,
        le=1_000_000,
        description="of those, from one client address (behind a NAT, all its tenants')",
    )
    gateway_header_timeout_s: float = Field(
        10.0,
        gt=0,
        le=300,
        description="a request's line and headers must arrive within this of its"
        " connection's start or the last response (else it is closed)",
    )
    gateway_body_timeout_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="a request's whole body must come within this once its head has (else"
        " 408): a trickled body held its request's slot for ever",
    )
    done_max_len: int = Field(
        1_000_000, ge=1000, description="cap of a client's completion list (oldest dropped)"
    )
    allow_network: bool = Field(
        False,
        description="let jobs ask for `limits.network` (process/bwrap: the host network,"
        " broker included; docker: the farm's bridge, where jobs reach neither each other"
        " nor the host)",
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
    chain_s: float = Field(
        5.0,
        ge=0,
        description="seconds a slot goes on taking the next dispatched job itself, in the"
        " round trip that stores the last one's result, before it returns to Celery for a"
        " message (0: one Celery message per job)",
    )
    flower_port: int = Field(5555, description="`sandfarm flower` port")
    metrics_port: int = Field(9808, description="`sandfarm metrics` port (the collector)")
    metrics_token: str = Field(
        "",
        description="bearer token `/metrics` requires (collector and gateway); without it the"
        " gateway serves no `/metrics` and the collector only binds loopback",
    )
    workspace_dir: Path | None = Field(
        None,
        description="where job workspaces live; default: /var/lib/sandfarm/work as root"
        " (never under /run, which jobs do not see)",
    )
    exec_helper: str = Field(
        d.EXEC_HELPER_AUTO,
        description="local backends' sandfarm-exec: a path, `auto` (beside the interpreter,"
        " else on PATH) or empty (Python child setup, slower)",
    )
    cgroup_favordynmods: bool = Field(
        True,
        description="local backends, as root: remount cgroup2 with `favordynmods`"
        " (host-wide; ~8 ms less per step); false leaves the host's mount as it is",
    )
    raise_pid_max: bool = Field(
        True,
        description="workers, as root: raise `kernel.pid_max` to 4194304 (as Debian's systemd"
        " does at boot) where lower, so jobs at their process maximum cannot fill the"
        " host's pid table (host-wide); false leaves it as it is",
    )
    prewarm: bool = Field(
        True,
        description="local backends: set up the next job's sandbox (workspace, namespaces,"
        " cgroups, uid) before it arrives, and tear the last one down after its result;"
        " false does both on the job's own time",
    )
    docker_image: str = Field(
        d.DOCKER_IMAGE, description="docker backend: default (and allowed) image"
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
        for name in (self.default_backend, *self.backends.split(",")):
            if name.strip() and name.strip() not in BACKEND_NAMES:
                raise ValueError(f"unknown backend {name.strip()!r}; choose from {BACKEND_NAMES}")
        return self

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, url: str) -> str:
        return urls.validate(url)

    @property
    def served_backends(self) -> tuple[str, ...]:
        """What a worker serves: its default first, then the rest of ``backends``."""
        names = [name.strip() for name in self.backends.split(",") if name.strip()]
        return tuple(dict.fromkeys([self.default_backend, *names]))

    @property
    def visibility_timeout(self) -> float:
        return margins.visibility_timeout(self.visibility_timeout_s)

    @property
    def restore_interval(self) -> float:
        if self.restore_interval_s:
            return self.restore_interval_s
        return min(10.0, max(1.0, self.visibility_timeout / 4))

    @cached_property
    def keys(self) -> Keys:
        return Keys(self.key_prefix)

    def backend_config(
        self,
        name: str,
        *,
        slot: int | None = None,
        spare_slot: int | None = None,
        worker: str | None = None,
    ) -> ProcessConfig | BwrapConfig | DockerConfig:
        """The typed config of backend ``name`` as these settings describe it (``slot`` and
        ``spare_slot``: a worker's pool process's; docker uses the first only)."""
        common: dict[str, Any] = {
            "allow_weaker": self.allow_weaker,
            "allow_network": self.allow_network,
            "worker": worker,
            "slot": slot,
            "workspace_dir": self.workspace_dir,
        }
        if name == "docker":
            return backend_config(
                name,
                **common,
                image=self.docker_image,
                runtime=self.docker_runtime,
                warm_pool=self.docker_warm_pool,
            )
        return backend_config(
            name,
            **common,
            exec_helper=self.exec_helper,
            favor_dynmods=self.cgroup_favordynmods,
            prewarm=self.prewarm,
            spare_slot=spare_slot,
        )

    @classmethod
    def default_of(cls, name: str) -> object:
        return cls.model_fields[name].default

    @classmethod
    def table(cls) -> str:
        """The settings as a Markdown table (for the README)."""
        rows = ["| variable | default | meaning |", "|---|---|---|"]
        for name, field in cls.model_fields.items():
            default = "" if field.default in (None, "") else f"`{field.default}`"
            rows.append(f"| `SANDFARM_{name.upper()}` | {default} | {field.description} |")
        return "\n".join(rows)


def get_settings(**overrides: Any) -> Settings:
    """Settings from the environment, with explicit (non-None) overrides on top."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
