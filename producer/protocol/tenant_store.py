"""Tenants in Redis: their policies and API keys (only hashes), with the farm's state.

An API key is a random token shown once; several per tenant, so a rotation has no gap;
revoking one deletes its lookup, so the next request with it fails.
"""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime
from typing import Any

import redis
from pydantic import ValidationError

from producer.protocol import margins
from producer.protocol.errors import TenantError, first_problem
from producer.protocol.keys import Keys
from producer.protocol.scripts import FarmScripts, loads
from producer.protocol.tenants import TENANT_RE, ApiKey, Policy, key_hash, new_key
from sandbox_core import JobResult, Status


def text(value: object) -> str:
    """A Redis reply as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _glob_escaped(text: str) -> str:
    """``text`` as a Redis MATCH pattern that matches only itself."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


# A tenant from an export, whole or not at all (an import cut off between its policy and
# its keys left it keyless, and the next import kept it so: a review).
_RESTORE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 'kept' end
if redis.call('EXISTS', KEYS[3], KEYS[4]) > 0 then return 'held' end
for i = 6, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then return 'clash ' .. (i - 5) end
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[2])
for i = 6, #KEYS do
  local at = 3 + (i - 6) * 3
  redis.call('SET', KEYS[i], ARGV[at + 1])
  redis.call('HSET', KEYS[5], ARGV[at], ARGV[at + 2])
end
return 'restored'
"""


def _check_name(name: str) -> None:
    if not TENANT_RE.fullmatch(name):
        raise TenantError(name, "a tenant name is 1-32 of [a-z0-9-], starting alphanumeric")


class TenantStore:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys

    # --- tenants ------------------------------------------------------------------

    def add(self, name: str, policy: Policy) -> None:
        _check_name(name)
        held = self.redis.exists(self.keys.joblist(name), self.keys.removed(name))
        if held and not self.get(name):
            # a new team must not read a removed one's results under the old ids
            raise self.held_error(name)
        if not self.redis.set(self.keys.tenant(name), policy.model_dump_json(), nx=True):
            raise TenantError(name, "already exists (tenant set changes it)")
        self.redis.sadd(self.keys.tenants, name)

    def held_error(self, name: str) -> TenantError:
        """Why a removed tenant's name cannot be given to a new one yet."""
        left = max(0, int(self.redis.ttl(self.keys.removed(name))))
        return TenantError(
            name,
            "a removed tenant's job records still hold this name until they expire"
            + (f" (in {left} s at the latest)" if left else "")
            + f": choose another, or delete them (sandfarm tenant remove {name} --purge;"
            " jobs it still has running hold the name until they end)",
        )

    def restore(self, name: str, policy: Policy, keys: list[ApiKey]) -> str:
        """Make tenant ``name`` with its policy and keys (from an export) in one step, or
        nothing: "restored", "kept" (it exists), "held" (a removed tenant's records hold
        the name) or "clash <key id>" (a key's hash is already some key's here)."""
        _check_name(name)
        k = self.keys
        names = [k.tenant(name), k.tenants, k.joblist(name), k.removed(name), k.tenant_keys(name)]
        names += [k.api_key(key.digest) for key in keys]
        args = [policy.model_dump_json(), name]
        for key in keys:
            args += [key.id, f"{name} {key.id}", key.model_dump_json()]
        reply = text(self.redis.eval(_RESTORE, len(names), *names, *args))
        if reply.startswith("clash "):
            return "clash " + keys[int(reply.split()[1]) - 1].id
        return reply

    def ensure(self, name: str, policy: Policy | None = None) -> Policy:
        """The tenant's policy, made (default policy) if it does not exist yet."""
        found = self.get(name)
        if found is not None:
            return found
        policy = policy or Policy()
        if self.redis.set(self.keys.tenant(name), policy.model_dump_json(), nx=True):
            self.redis.sadd(self.keys.tenants, name)
            return policy
        return self.policy(name)  # someone else made it meanwhile

    def get(self, name: str) -> Policy | None:
        raw = self.redis.get(self.keys.tenant(name))
        if raw is None:
            return None
        try:
            return Policy.model_validate_json(raw)
        except ValidationError:
            return Policy()  # written by a newer farm: be no more permissive than the default

    def policy(self, name: str) -> Policy:
        found = self.get(name)
        if found is None:
            raise TenantError(name, "no such tenant")
        return found

    def update(self, name: str, **changes: Any) -> Policy:
        current = self.policy(name)
        try:
            policy = Policy.model_validate({**current.model_dump(), **changes})
        except ValidationError as exc:
            field, reason = first_problem(exc)
            raise TenantError(name, f"{field or 'policy'}: {reason}") from None
        self.redis.set(self.keys.tenant(name), policy.model_dump_json())
        return policy

    def names(self) -> list[str]:
        return sorted(text(n) for n in self.redis.smembers(self.keys.tenants))

    def remove(self, name: str, scripts: FarmScripts, *, purge: bool = False) -> tuple[int, int]:
        """Remove a tenant: its keys stop working at once, its waiting jobs end `cancelled`
        (never run), its dispatched ones are asked to cancel. Returns both counts. With
        ``purge``, its job records (results included) are deleted too, so the name is
        free again at once; a removed tenant's leftover records can be purged later."""
        if purge and self.get(name) is None:
            self._purge(name)
            return 0, 0
        ttl = self.policy(name).result_ttl_s  # its results', as its workers store them
        for key_id in list(self.key_ids(name)):
            self.revoke_key(name, key_id)
        # The name stays taken while any of its results may live: those stored now (this
        # TTL), those its running jobs store as they end (each with the TTL it was
        # submitted with: a job record's TTL left is at least its result's to come, a
        # review found the policy's lowered since), and results stored before.
        hold = max(ttl, self._longest_ttl(name)) + margins.REMOVED_NAME_HOLD_S
        # Take the waiting jobs out of dispatch's reach first, in one step: cancelling
        # them one by one while they are still listed let each cancel free a dispatch
        # slot that dispatch refilled from the same list (hundreds of dead messages in
        # the Celery queue, every other tenant's jobs behind them).
        pipe = self.redis.pipeline(transaction=True)
        pipe.lrange(self.keys.pending(name), 0, -1)
        # the queue, its jobs' sizes and their sum go together (lib_dispatch leave_queue)
        pipe.delete(self.keys.pending(name), self.keys.sizes(name), self.keys.queued(name))
        pipe.srem(self.keys.ready, name)
        pending = [text(q) for q in pipe.execute()[0]]
        cancelled = 0
        for qid in pending:
            notify = (loads(self.redis.get(self.keys.job(qid))) or {}).get("notify")
            result = JobResult(
                id=qid.partition("/")[2], status=Status.CANCELLED, message="tenant removed"
            )
            result.timings.finished_at = datetime.now(UTC)
            cancelled += scripts.store_result(
                result, notify, qid, name, ttl=ttl, count_duplicate=False
            )
        active = [text(q) for q in self.redis.zrange(self.keys.active(name), 0, -1)]
        pipe = self.redis.pipeline(transaction=True)
        for qid in active:
            pipe.set(self.keys.cancel(qid), "1", ex=3600)
        pipe.delete(self.keys.pending(name), self.keys.tenant(name), self.keys.tenant_keys(name))
        # a submission that passed its key check before the revoke may have queued since
        pipe.delete(self.keys.sizes(name), self.keys.queued(name))
        pipe.srem(self.keys.tenants, name)
        pipe.srem(self.keys.ready, name)
        # (the job list's TTL runs from the last submission, so it could go first: a
        # review); lib_store keeps a result stored later within it
        pipe.set(self.keys.removed(name), "1", ex=hold)
        pipe.execute()
        if purge:
            self._purge(name)
        return cancelled, len(active)

    def _purge(self, name: str, chunk: int = 500) -> None:
        """Delete every record of the tenant's jobs: those its job list names, then any
        left under its name (the list drops entries by submission time, while a result
        lives its TTL from when it was stored: a review), found by a scan of the keys."""
        # First: jobs it still has dispatched may store results, during the purge or
        # after. Then the name stays held as long as they may, no longer, and lib_store
        # keeps such a result within the hold (a review: with the hold deleted, a result
        # stored after the purge outlived it, and a new team under the name read it).
        # With none, the name is free at the end.
        running = self.redis.zcard(self.keys.active(name))
        if running:
            self.redis.set(self.keys.removed(name), "1", ex=margins.REMOVED_NAME_HOLD_S)
        listing = self.keys.joblist(name)
        while True:
            qids = [text(q) for q in self.redis.zrange(listing, 0, chunk - 1)]
            if not qids:
                break
            pipe = self.redis.pipeline(transaction=False)
            for qid in qids:
                pipe.delete(*self._records(qid))
            pipe.zrem(listing, *qids)
            pipe.execute()
        for record in self._records(f"{name}/"):
            found = self._keys_under(record)
            for start in range(0, len(found), chunk):
                self.redis.delete(*found[start : start + chunk])
        self.redis.delete(listing, self.keys.bucket(name), self.keys.charged(name))
        self.redis.delete(self.keys.sizes(name), self.keys.queued(name))
        if not running:
            self.redis.delete(self.keys.removed(name))
        # its place in fair share: a team added later under the name starts at the clock,
        # not behind the charges of jobs the purge left running
        self.redis.hdel(self.keys.vtime, name)

    def _longest_ttl(self, name: str) -> int:
        """The longest TTL left of the tenant's job records and results (0 if none),
        found by a scan of the keys (an operator's command)."""
        longest = 0
        for record in (self.keys.job(f"{name}/"), self.keys.result(f"{name}/")):
            found = self._keys_under(record)
            for start in range(0, len(found), 1000):
                pipe = self.redis.pipeline(transaction=False)
                for key in found[start : start + 1000]:
                    pipe.ttl(key)
                longest = max([longest, *(int(t) for t in pipe.execute())])
        return longest

    def _keys_under(self, prefix: str) -> list[str]:
        """Every key that starts with ``prefix`` (a scan of the keyspace, 1,000 a step)."""
        pattern = _glob_escaped(prefix) + "*"
        return [text(k) for k in self.redis.scan_iter(match=pattern, count=1000)]

    def _records(self, qid: str) -> tuple[str, ...]:
        keys = self.keys
        return (
            keys.result(qid),
            keys.stored_by(qid),
            keys.job(qid),
            keys.message(qid),
            keys.attempts(qid),
        )

    # --- API keys -----------------------------------------------------------------

    def create_key(self, name: str) -> tuple[str, ApiKey]:
        """A new key for the tenant: the token (to show once) and its record."""
        self.policy(name)
        token = new_key()
        record = ApiKey(
            id=secrets.token_hex(4),
            tenant=name,
            created=datetime.now(UTC),
            shown=token[:9],
            digest=key_hash(token),
        )
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.keys.tenant_keys(name), record.id, record.model_dump_json())
        pipe.set(self.keys.api_key(record.digest), f"{name} {record.id}")
        pipe.execute()
        return token, record

    def key_ids(self, name: str) -> list[str]:
        return sorted(text(k) for k in self.redis.hkeys(self.keys.tenant_keys(name)))

    def keys_of(self, name: str) -> list[ApiKey]:
        raw = self.redis.hgetall(self.keys.tenant_keys(name))
        return sorted(
            (ApiKey.model_validate_json(v) for v in raw.values()), key=lambda k: k.created
        )

    def revoke_key(self, name: str, key_id: str) -> bool:
        """Revoke one key; True if it existed. Its lookup goes: the next request fails."""
        raw = self.redis.hget(self.keys.tenant_keys(name), key_id)
        if raw is None:
            return False
        record = ApiKey.model_validate_json(raw)
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.keys.api_key(record.digest))
        pipe.hdel(self.keys.tenant_keys(name), key_id)
        pipe.execute()
        return True

    def authenticate(self, token: str) -> str | None:
        """The tenant a key belongs to, or None (unknown, revoked, or its tenant gone)."""
        ref = self.redis.get(self.keys.api_key(key_hash(token)))
        if ref is None:
            return None
        name, _, key_id = text(ref).partition(" ")
        if not self.redis.hexists(self.keys.tenant_keys(name), key_id):
            return None
        return name
