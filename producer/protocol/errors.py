"""The farm's errors, under sandfarm's one root (the tree is drawn in sandbox_core.errors)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from pydantic import ValidationError

from sandbox_core.errors import SandfarmError

T = TypeVar("T")


def first_problem(exc: ValidationError) -> tuple[str, str]:
    """A pydantic validation's first error: (its dotted field, "" for the whole; reason)."""
    err = exc.errors(include_url=False)[0]
    field = ".".join(str(p) for p in err["loc"])
    return field, str(err["msg"]).removeprefix("Value error, ")


class FarmError(SandfarmError):
    """The farm itself failed (not a job, not a spec)."""


class FarmUnavailableError(FarmError, ConnectionError):
    """The farm does not answer at ``url`` (Redis, or a gateway's http(s) URL); ``cause``
    says why in plain words."""

    def __init__(self, url: str, cause: str) -> None:
        self.url = url
        self.cause = cause
        what = "gateway" if url.startswith(("http://", "https://")) else "Redis"
        super().__init__(f"no {what} answers at {url}: {cause}")


class SlotReservationError(FarmError, RuntimeError):
    """A worker found no block of ``size`` free sandbox slots on its host."""

    def __init__(self, size: int, where: str) -> None:
        self.size = size
        self.where = where
        super().__init__(f"no block of {size} free sandbox slots {where} on this host")


class IdConflictError(FarmError, ValueError):
    """Job ids already taken by a different spec: a reused id never returns a stale result.

    ``conflicts``: the refused ids; ``submitted``: the ids of the same call that were
    accepted (new, or the same spec again), in order."""

    def __init__(self, conflicts: list[str], submitted: list[str]) -> None:
        self.conflicts = conflicts
        self.submitted = submitted
        shown = ", ".join(repr(i) for i in conflicts[:3]) + (" ..." if len(conflicts) > 3 else "")
        super().__init__(
            f"job id {shown} already names a different job (give another id, or the same spec)"
        )


class AuthError(FarmError, PermissionError):
    """The gateway refused the API key (missing, malformed, unknown or revoked)."""


class TenantError(FarmError, ValueError):
    """A tenant cannot be made, found or changed as asked: ``tenant``, ``reason``."""

    def __init__(self, tenant: str, reason: str) -> None:
        self.tenant = tenant
        self.reason = reason
        super().__init__(f"tenant {tenant!r}: {reason}")


class TenantsFileError(FarmError, ValueError):
    """A tenants export cannot be read or is not one: ``path``, ``reason`` (the field)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class QuotaError(FarmError, RuntimeError):
    """A tenant's quota refused a submission: ``reason`` ("rate", "queue_full",
    "queue_bytes", "budget": CPU or result bytes) and how long to wait before trying
    again (``retry_after_s``), nothing of that call accepted. ``fewer``: the same call
    can never pass (or not today), but a smaller one can (a client splits it).
    ``submitted``: the ids a client's earlier calls got admitted (submit_many)."""

    def __init__(
        self,
        tenant: str,
        reason: str,
        message: str,
        retry_after_s: float,
        *,
        fewer: bool = False,
    ) -> None:
        self.tenant = tenant
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.fewer = fewer
        self.submitted: list[str] = []
        super().__init__(f"tenant {tenant!r}: {message}")


def send_each(parts: Iterable[T], send: Callable[[T], object]) -> None:
    """``send`` each part in turn (a call split because a smaller one would pass): a part
    refused for a budget does not stop the next (its jobs may keep less), and the first
    such refusal is raised once every part was sent."""
    refused: QuotaError | None = None
    for part in parts:
        try:
            send(part)
        except QuotaError as exc:
            if exc.reason != "budget":
                raise
            refused = refused or exc
    if refused is not None:
        raise refused


class JobsLostError(FarmError, LookupError):
    """Jobs waited on that the farm holds no record of: no state, no result. They will
    never finish: never submitted there, expired, or lost with Redis's data (restarted
    empty, flushed, or failed over to a replica that had no copy yet)."""

    def __init__(self, ids: list[str], where: str) -> None:
        self.ids = ids
        self.where = where
        shown = ", ".join(repr(i) for i in ids[:3]) + (" ..." if len(ids) > 3 else "")
        super().__init__(
            f"{len(ids)} jobs are unknown to the farm at {where} ({shown}): never submitted"
            " there, expired, or lost with its Redis's data (restarted empty, flushed, or"
            " failed over to a replica without a copy); submit them again (`batch run`"
            " resumes them: finished lines are kept)"
        )


class InputChangedError(FarmError, RuntimeError):
    """A batch input line changed between validation and submission."""

    def __init__(self, path: str, line: int) -> None:
        self.path = path
        self.line = line
        super().__init__(f"{path}: line {line} changed during the batch run")


class LateStepError(FarmError, TimeoutError):
    """A chain's step came back too late for the job it took: its answer arrived after
    redis-py resent it (a lost connection), and that job no longer fits the limits of
    the message the chain runs under. The message goes back; its redelivery runs it."""

    def __init__(self, qid: str, timeout_s: float, room_s: float) -> None:
        self.qid = qid
        super().__init__(
            f"the chain took {qid} ({timeout_s:g} s) but its answer came late: {room_s:.1f} s"
            " left under this message's limits; the message goes back and runs it"
        )
