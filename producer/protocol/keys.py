"""Every Redis key of the farm: ours (under the key prefix, each with a TTL) and the few
of kombu's that the farm reads (the queue list and the unacked hash)."""

from __future__ import annotations

# kombu's Redis transport keeps delivered-but-unacked messages in this hash (its default
# ``unacked_key``); the farm only reads its length.
KOMBU_UNACKED = "unacked"


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
    def ignored(self) -> str:  # count of second results nobody needs counted (a cancel race)
        return f"{self.prefix}stats:ignored"

    @property
    def in_flight(self) -> str:  # sorted set job id -> expiry, for `status`
        return f"{self.prefix}inflight"

    @property
    def workers(self) -> str:  # hash worker name -> heartbeat JSON
        return f"{self.prefix}workers"
