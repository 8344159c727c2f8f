"""The gateway's request and response bodies (the job and result schemas are
sandbox_core's own JobSpec and JobResult)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from producer.protocol.tenants import Policy
from sandbox_core import JobSpec
from sandbox_core.models import JobResult

MAX_JOBS_PER_REQUEST = 1000
MAX_IDS_PER_REQUEST = 1000
MAX_WAIT_S = 60.0

JobIdList = list[str]
# A job id as a request names one: at most 128 characters, as every id is (JobSpec.id);
# a longer one could name nothing, and 1,000 of 16 KB went to Redis at every poll of a
# waiting /results (an attack review).
JobId = Annotated[str, Field(min_length=1, max_length=128)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobList(_Body):
    jobs: list[JobSpec] = Field(min_length=1, max_length=MAX_JOBS_PER_REQUEST)


class Accepted(BaseModel):
    """The ids of the accepted jobs, in order (the server names those that gave none)."""

    ids: list[str]


class JobProgress(BaseModel):
    """A job that is not final yet."""

    id: str
    status: Literal["queued", "running"]


class ResultsRequest(_Body):
    ids: list[JobId] = Field(min_length=1, max_length=MAX_IDS_PER_REQUEST)
    wait: float = Field(0.0, ge=0, le=MAX_WAIT_S, description="seconds to wait for one more")


class Results(BaseModel):
    results: list[JobResult]
    pending: list[str] = Field(
        description="ids not final yet, or final but over this reply's size bound: ask again"
    )
    unknown: list[str] = Field(description="ids this tenant never submitted (or expired)")


class CancelRequest(_Body):
    ids: list[JobId] = Field(min_length=1, max_length=MAX_IDS_PER_REQUEST)


class Cancelled(BaseModel):
    cancelled: list[str]
    not_cancelled: list[str] = Field(description="already final, or unknown")


class SpecHashesRequest(_Body):
    ids: list[JobId] = Field(min_length=1, max_length=MAX_IDS_PER_REQUEST)


class SpecHashes(BaseModel):
    hashes: dict[str, str] = Field(description="id -> the spec hash it names")


class JobSummary(BaseModel):
    id: str
    status: str
    labels: dict[str, str]


class JobPage(BaseModel):
    jobs: list[JobSummary]
    next: str | None = Field(
        None, description="the cursor of the next page (null at the end; a page may be short)"
    )


class Usage(BaseModel):
    tenant: str
    policy: Policy
    waiting: int
    dispatched: int
    today: dict[str, float]
    days: dict[str, dict[str, float]] = Field(description="UTC day -> counters, last week")


class Health(BaseModel):
    status: Literal["ok"]
