"""Tenants: the teams sharing a farm, each with API keys and a policy, and the admission
rule every submission passes (the gateway's and the trusted FarmClient's alike).

A policy caps what a tenant's jobs may ask for (never above the farm's maxima), how many
may run and wait at once, how fast it may submit, and its fair share (weight). A job
over a cap is refused naming the field and the cap — never clamped.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sandbox_core import JobSpec, Limits
from sandbox_core import defaults as d
from sandbox_core.backends import BACKEND_NAMES
from sandbox_core.errors import PolicyError, SpecError

TENANT_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
KEY_PREFIX = "sf_"  # every API key starts so: easy to spot in a leaked log
# The limits a policy may cap, with the farm's own maximum of each.
CAPPABLE: dict[str, float] = {
    "timeout_s": d.TIMEOUT_S[1],
    "cpu_s": d.CPU_S[1],
    "memory_mb": d.MEMORY_MB[1],
    "processes": d.PROCESSES[1],
    "open_files": d.OPEN_FILES[1],
    "file_size_mb": d.FILE_SIZE_MB[1],
    "output_bytes": d.OUTPUT_BYTES[1],
    "flood_kill_bytes": d.FLOOD_KILL_BYTES[1],
    "workspace_mb": d.WORKSPACE_MB[1],
    "cpus": d.CPUS[1],
    "ptys": d.PTYS[1],
}
DEFAULT_MAX_QUEUED = 100_000
# Redis memory a tenant may hold: the bytes of its waiting jobs (a waiting job is ~1-2 KB,
# its files inside it up to the gateway's body bound), and of the results it may store a
# day (each kept result_ttl_s: a week of them at most, by default).
DEFAULT_MAX_QUEUED_MB = 256
DEFAULT_RESULT_MB_PER_DAY = 512
MIB = 1024 * 1024
DAY_S = 86_400

TenantName = Annotated[str, Field(pattern=TENANT_RE.pattern)]


class Policy(BaseModel):
    """What a tenant may do. Unset caps mean the farm's own maxima."""

    model_config = ConfigDict(extra="forbid")

    weight: float = Field(1.0, gt=0, le=1000, description="fair share against other tenants")
    max_running: int | None = Field(None, ge=1, description="jobs dispatched at once")
    max_queued: int = Field(DEFAULT_MAX_QUEUED, ge=1, description="jobs waiting at once")
    max_queued_mb: int = Field(
        DEFAULT_MAX_QUEUED_MB,
        ge=1,
        description="MiB of Redis the jobs waiting at once may hold (message + state)",
    )
    rate: float | None = Field(None, gt=0, description="submissions per second (token bucket)")
    burst: int | None = Field(None, ge=1, description="bucket size (default: 2 s of rate)")
    backends: list[str] | None = Field(None, description="allowed backends (None: all)")
    images: list[str] | None = Field(None, description="allowed docker images (None: any)")
    caps: dict[str, float] = Field(default_factory=dict, description="limit -> its maximum")
    network: bool = Field(False, description="may ask for limits.network")
    result_ttl_s: int = Field(7 * DAY_S, ge=60, le=90 * DAY_S, description="result lifetime")
    cpu_budget_s_per_day: float | None = Field(None, gt=0, description="CPU seconds a day")
    result_mb_per_day: int = Field(
        DEFAULT_RESULT_MB_PER_DAY, ge=1, description="MiB of results stored a day (UTC)"
    )

    @model_validator(mode="after")
    def _check(self) -> Policy:
        for name, value in self.caps.items():
            if name not in CAPPABLE:
                raise ValueError(f"caps.{name}: not a limit (choose from {', '.join(CAPPABLE)})")
            if value > CAPPABLE[name] or value <= 0:
                raise ValueError(f"caps.{name}: {value:g} is outside 0..{CAPPABLE[name]:g}")
            try:  # a cap is also a job's limit (a default takes it): it must be one
                Limits.model_validate({name: value})
            except ValidationError as exc:
                reason = exc.errors(include_url=False)[0]["msg"]
                raise ValueError(
                    f"caps.{name}: {value:g} is not a valid limit ({reason})"
                ) from None
        for name in self.backends or []:
            if name not in BACKEND_NAMES:
                raise ValueError(f"backends: unknown backend {name!r}")
        return self

    @property
    def bucket(self) -> tuple[float, float] | None:
        """(rate, burst) of the token bucket, or None when submissions are not rated."""
        if self.rate is None:
            return None
        return self.rate, float(self.burst or max(1.0, 2 * self.rate))


class ApiKey(BaseModel):
    """What the farm keeps of an API key: never the key, only its hash."""

    model_config = ConfigDict(extra="ignore")

    id: str
    tenant: str
    created: datetime
    shown: str  # the first characters, to tell keys apart in a listing
    digest: str  # key_hash(key): the lookup it is found by


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_hash(key: str) -> str:
    """A key is random (256 bits): a plain SHA-256 is enough to store it, no KDF needed."""
    return hashlib.sha256(key.encode()).hexdigest()


def admit(spec: JobSpec, policy: Policy) -> JobSpec:
    """The job as this tenant may run it, or SpecError (naming the field and the cap) or
    PolicyError. A limit the job sets over a cap is refused, never clamped; a limit it
    leaves to the farm's default takes the tenant's cap where that is lower."""
    limits = spec.limits
    lowered: dict[str, float | int] = {}
    for name, cap in policy.caps.items():
        value = getattr(limits, name)
        if value <= cap:
            continue
        if name in limits.model_fields_set:
            raise SpecError(f"limits.{name}", f"{value:g} is over this tenant's cap of {cap:g}")
        lowered[name] = type(value)(cap)
    backend = spec.backend
    if policy.backends is not None and backend not in policy.backends:
        allowed = ", ".join(policy.backends)
        if backend is None:  # the worker's default could be any: the job must say
            raise PolicyError("backend", f"name one: this tenant may use {allowed}")
        raise PolicyError("backend", f"{backend!r} is not allowed for this tenant ({allowed})")
    if policy.images is not None and spec.image is not None and spec.image not in policy.images:
        raise PolicyError("image", f"{spec.image!r} is not allowed for this tenant")
    if limits.network and not policy.network:
        raise PolicyError("limits.network", "network access is not allowed for this tenant")
    if not lowered:
        return spec
    return spec.model_copy(update={"limits": limits.model_copy(update=lowered)})


def qualified(tenant: str, job_id: str) -> str:
    """A job's farm-wide id: ids are per tenant ("/" is in neither name)."""
    return f"{tenant}/{job_id}"


def split(qid: str) -> tuple[str, str]:
    tenant, _, job_id = qid.partition("/")
    return tenant, job_id


def policy_json(policy: Policy) -> dict[str, Any]:
    """The policy as the Lua scripts read it (cjson): only what dispatch needs, plus all."""
    return policy.model_dump(mode="json")
