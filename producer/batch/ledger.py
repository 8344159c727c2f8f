"""Is an id already answered in RESULTS still the job its line describes?

A derived id is content-addressed (an edited line gets a new one), but a line's own id is
not: edit the line, keep its id, and resume would skip it and report the old verdict.
The farm records each id's spec hash when it is submitted, so such a line is checked
against that record (read-only, one MGET per chunk) and refused as a conflict when the
spec differs. Where the farm no longer knows the id (its TTL passed) RESULTS is trusted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from producer.protocol.records import spec_hash
from sandbox_core import JobSpec

Recorded = Callable[[Sequence[str]], dict[str, str]]  # ids -> spec hash the farm recorded
CHUNK = 1000


@runtime_checkable
class KnowsHashes(Protocol):
    """A client that can say which spec each id names (FarmClient, GatewayClient)."""

    def known_hashes(self, ids: Sequence[str]) -> dict[str, str]: ...


def farm_recorded(client: object) -> Recorded | None:
    """The spec-hash lookup of a client, chunked; None for a client without one."""
    if not isinstance(client, KnowsHashes):
        return None
    farm: KnowsHashes = client

    def recorded(ids: Sequence[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for start in range(0, len(ids), CHUNK):
            found.update(farm.known_hashes(list(ids[start : start + CHUNK])))
        return found

    return recorded


def digest(spec: JobSpec) -> str:
    """The hash the farm records for ``spec`` (FarmClient hashes its compact form)."""
    from producer.protocol.submission import compact_spec  # the one definition hashed

    return spec_hash(compact_spec(spec))


def changed(recorded: Recorded, hashes: dict[str, str]) -> set[str]:
    """Ids of ``hashes`` (id -> the current spec's hash) the farm holds for another spec."""
    known = recorded(list(hashes))
    # "": recorded before the farm kept hashes, so it cannot tell: not a conflict
    return {job_id for job_id, old in known.items() if old not in ("", hashes[job_id])}
