"""Who is asking: the tenant of the request's API key, and the jobs it may see.

Every lookup is scoped by the tenant: an id of another tenant's is simply unknown here
(404), never "forbidden" (that would say it exists).
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from fastapi import Header, Request

from producer.gateway.problems import ProblemError
from producer.jobs import TenantJobs
from producer.protocol import Settings
from producer.protocol.ids import CLIENT_ID_RE, CLIENT_ID_RULE
from producer.protocol.tenant_store import TenantStore

UNAUTHORIZED = {"WWW-Authenticate": 'Bearer realm="sandfarm"'}


@dataclass
class Farm:
    """What every request shares: one Redis pool, the settings."""

    redis: redis.Redis
    settings: Settings

    @property
    def tenants(self) -> TenantStore:
        return TenantStore(self.redis, self.settings.keys)


@dataclass
class Caller:
    tenant: str
    jobs: TenantJobs
    done_key: str | None  # the completion list of the caller's client, if it named one


def farm_of(request: Request) -> Farm:
    farm = request.app.state.farm
    assert isinstance(farm, Farm)
    return farm


def tenant_of(farm: Farm, authorization: str | None) -> str:
    """The tenant of an Authorization header's API key (401 for a missing, malformed,
    unknown or revoked key)."""
    if not authorization:
        raise _unauthorized("no API key: send Authorization: Bearer <key>")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthorized("malformed Authorization header: want Bearer <key>")
    tenant = farm.tenants.authenticate(token.strip())
    if tenant is None:
        raise _unauthorized("unknown or revoked API key")
    return tenant


def caller(
    request: Request,
    authorization: str | None = Header(None, description="Bearer <API key>"),
    sandfarm_client: str | None = Header(
        None, description="a client's own name for its completion list (waits for results)"
    ),
) -> Caller:
    """The request's tenant: as admission found it (producer/gateway/admission.py), else
    looked up here."""
    farm = farm_of(request)
    tenant = request.scope.get("state", {}).get("tenant") or tenant_of(farm, authorization)
    done_key = None
    if sandfarm_client is not None:
        if not CLIENT_ID_RE.fullmatch(sandfarm_client):
            raise ProblemError(
                422,
                "invalid",
                "Invalid request",
                f"Sandfarm-Client: {CLIENT_ID_RULE}",
                field="Sandfarm-Client",
            )
        done_key = farm.settings.keys.done(f"{tenant}:{sandfarm_client}")
    return Caller(tenant, TenantJobs(farm.redis, farm.settings, tenant), done_key)


def _unauthorized(detail: str) -> ProblemError:
    return ProblemError(401, "unauthorized", "Unauthorized", detail, headers=UNAUTHORIZED)
