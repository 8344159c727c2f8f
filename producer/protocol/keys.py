"""Every Redis key of the farm: ours (under the key prefix, each with a TTL) and the few
of kombu's that the farm reads (the queue list and the unacked hash)."""

from __future__ import annotations

# kombu's Redis transport keeps delivered-but-unacked messages in this hash (its default
# ``unacked_key``), and the time of each delivery in this sorted set (its
# ``unacked_index_key``): the farm counts the first, and a dead worker's reaper gives its
# runs' messages back from both (worker/giveback.py).
KOMBU_UNACKED = "unacked"
KOMBU_UNACKED_INDEX = "unacked_index"


class Keys:
    """Every Redis key sandfarm writes (the Celery broker keys are kombu's own)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def job(self, job_id: str) -> str:  # submission state (idempotency), TTL
        return f"{self.prefix}job:{job_id}"

    def result(self, job_id: str) -> str:  # the bounded JobResult JSON, TTL, SET NX
        return f"{self.prefix}result:{job_id}"

    def stored_by(self, job_id: str) -> str:  # the token of the call that stored it, TTL
        return f"{self.prefix}stored:{job_id}"

    def attempts(self, job_id: str) -> str:  # deliveries so far, TTL
        return f"{self.prefix}attempts:{job_id}"

    def cancel(self, job_id: str) -> str:  # present: the client asked to cancel, TTL
        return f"{self.prefix}cancel:{job_id}"

    def running(self, job_id: str) -> str:  # present while a sandbox runs the job, TTL
        return f"{self.prefix}running:{job_id}"

    def chain(self, qid: str) -> str:  # hash q, m, o: the job a slot runs under qid's message
        return f"{self.prefix}chain:{qid}"

    def done(self, client_id: str) -> str:  # ids completed for one client, TTL + capped
        return f"{self.prefix}done:{client_id}"

    @property
    def duplicates(self) -> str:  # count of results a redelivery tried to store twice
        return f"{self.prefix}stats:duplicates"

    @property
    def stats(self) -> str:  # hash of the farm's counters (protocol.stats), TTL
        return f"{self.prefix}stats"

    @property
    def ignored(self) -> str:  # count of second results nobody needs counted (a cancel race)
        return f"{self.prefix}stats:ignored"

    @property
    def in_flight(self) -> str:  # sorted set job id -> expiry, for `status`
        return f"{self.prefix}inflight"

    @property
    def workers(self) -> str:  # hash worker name -> heartbeat JSON
        return f"{self.prefix}workers"

    # --- tenants (a job's id here is qualified: "tenant/id") ---------------------------

    @property
    def tenants(self) -> str:  # set of tenant names
        return f"{self.prefix}tenants"

    def tenant(self, name: str) -> str:  # the policy JSON
        return f"{self.prefix}tenant:{name}"

    def tenant_keys(self, name: str) -> str:  # hash key id -> ApiKey JSON
        return f"{self.prefix}tenant:{name}:keys"

    def api_key(self, digest: str) -> str:  # key hash -> "tenant key-id"
        return f"{self.prefix}apikey:{digest}"

    def pending(self, name: str) -> str:  # list of qids waiting for dispatch, FIFO
        return f"{self.prefix}pending:{name}"

    def message(self, qid: str) -> str:  # a waiting job's Celery message, TTL
        return f"{self.prefix}msg:{qid}"

    def queued(self, name: str) -> str:  # bytes of the jobs in pending(name): lib_dispatch
        return f"{self.prefix}queued:{name}"

    def sizes(self, name: str) -> str:  # list: each pending job's bytes, in step with it
        return f"{self.prefix}sizes:{name}"

    @property
    def ready(self) -> str:  # set of tenants with pending jobs
        return f"{self.prefix}ready"

    def active(self, name: str) -> str:  # zset qid -> expiry: dispatched, not final
        return f"{self.prefix}active:{name}"

    @property
    def active_all(self) -> str:  # the same over every tenant: the farm's capacity in use
        return f"{self.prefix}active"

    @property
    def vtime(self) -> str:  # hash tenant -> virtual time (service received / weight)
        return f"{self.prefix}vtime"

    @property
    def vclock(self) -> str:  # the virtual time of the last dispatch
        return f"{self.prefix}vclock"

    def charged(self, name: str) -> str:  # hash qid -> "charge weight": held until stored
        return f"{self.prefix}charged:{name}"

    def bucket(self, name: str) -> str:  # hash tokens, ts: the submission rate
        return f"{self.prefix}bucket:{name}"

    def usage(self, name: str, day: str) -> str:  # hash counters of one UTC day, TTL
        return f"{self.prefix}usage:{name}:{day}"

    def joblist(self, name: str) -> str:  # zset qid -> submit time, for listings
        return f"{self.prefix}jobs:{name}"

    def removed(self, name: str) -> str:  # a removed tenant's records may live: name held, TTL
        return f"{self.prefix}removed:{name}"
