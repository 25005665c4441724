"""Pending approvals in Redis: what a gateway holds, what a person decides, shared by every replica.

A gateway holding a request (``gateways/approval_step.py``) creates one record; any broker records
a person's decision on it; the gateway that holds the request settles it. Every change is one Lua
script (atomic across replicas) and is announced on the channel ``valetkey:approvals`` (the id
only), which each gateway process watches with one subscription (``gateways/approval_waiter.py``).

    pending ──approve(digest)──▶ approved ──settle(digest)──▶ consumed   (the request goes on)
       │ ──deny──▶ denied        │ ──deadline──▶ timeout      │ ──revoke / client gone──▶ cancelled

* A decision is bound to the request's **digest** (SHA-256 over upstream, method, path, query and
  body): an approval records the digest the approver saw, and the gateway consumes it only with
  the digest of the bytes it holds. It is single-use (``consumed``), never cached, and a retry of
  the request is a new record with a new id.
* At most ``cap`` records of one run are pending at once (``approval_queue_full``).
* Records are kept ``KEEP_AFTER`` past their deadline so the console and ``approvals show`` can
  say what became of them.

Keys (``contract/keys.py``), all in the slot ``{vk:apr}`` since every script touches several:
``{vk:apr}:approval:<id>`` (hash), ``{vk:apr}:pending`` (sorted set, id → deadline),
``{vk:apr}:run:<run>`` (set of the run's pending ids).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, fields
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from contract import keys
from contract.errors import Conflict, NotFound, Reason, Unavailable

CHANNEL = keys.APPROVAL_CHANNEL
PENDING = keys.APPROVALS_PENDING
PREFIX = keys.APPROVAL_PREFIX
RUN_PREFIX = keys.APPROVALS_RUN_PREFIX
KEEP_AFTER = 24 * 3600
PREVIEW_BYTES = 2048
STATES = ("pending", "approved", "denied", "timeout", "cancelled", "consumed")

# KEYS: run set, record, pending zset. ARGV: cap, id, deadline, ttl, then field/value pairs.
# The other records of the run are read by name: same slot as KEYS (the tag of PREFIX).
_CREATE = """
for _, other in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if redis.call('HGET', '""" + PREFIX + """' .. other, 'state') ~= 'pending' then
    redis.call('SREM', KEYS[1], other)
  end
end
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
local pairs = {}
for i = 5, #ARGV do pairs[#pairs + 1] = ARGV[i] end
redis.call('HSET', KEYS[2], unpack(pairs))
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('SADD', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
return 1
"""
# KEYS: record, pending zset. ARGV: state, digest, who, when, why, channel, id.
# A person's decision: only on a pending record before its deadline, approval bound to the digest.
_DECIDE = """
local rec = redis.call('HMGET', KEYS[1], 'state', 'digest', 'deadline')
if not rec[1] then return 'missing' end
if rec[1] ~= 'pending' then return rec[1] end
if tonumber(rec[3]) < tonumber(ARGV[4]) then return 'expired' end
if ARGV[1] == 'approved' and ARGV[2] ~= rec[2] then return 'digest_mismatch' end
if ARGV[2] ~= '' and ARGV[2] ~= rec[2] then return 'digest_mismatch' end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'decided_by', ARGV[3], 'decided_at', ARGV[4], 'why', ARGV[5])
redis.call('ZREM', KEYS[2], ARGV[7])
redis.call('PUBLISH', ARGV[6], ARGV[7])
return 'ok'
"""
# KEYS: record, pending zset, run set. ARGV: digest, state for a pending record ('' keeps it),
# who, when, channel, id. The holder's view: consume an approval of its digest, or end the wait
# (a timeout loses to an approval already recorded; a cancellation, the run revoked, wins over it).
_SETTLE = """
local rec = redis.call('HMGET', KEYS[1], 'state', 'digest')
if not rec[1] then return 'missing' end
if rec[1] == 'approved' and ARGV[2] ~= 'cancelled' then
  if rec[2] ~= ARGV[1] then return 'digest_mismatch' end
  redis.call('HSET', KEYS[1], 'state', 'consumed')
  redis.call('SREM', KEYS[3], ARGV[6])
  return 'approved'
end
if rec[1] == 'pending' or (rec[1] == 'approved' and ARGV[2] == 'cancelled') then
  if ARGV[2] == '' then return 'pending' end
  redis.call('HSET', KEYS[1], 'state', ARGV[2], 'decided_by', ARGV[3], 'decided_at', ARGV[4])
  redis.call('ZREM', KEYS[2], ARGV[6])
  redis.call('PUBLISH', ARGV[5], ARGV[6])
end
redis.call('SREM', KEYS[3], ARGV[6])
if rec[1] == 'pending' or rec[1] == 'approved' then return ARGV[2] end
return rec[1]
"""


def request_digest(upstream: str, method: str, target: str, body: bytes) -> str:
    """What an approval is bound to: these exact bytes, to this upstream."""
    h = hashlib.sha256()
    for part in (upstream, method, target):
        h.update(part.encode("utf-8", "surrogateescape") + b"\n")
    h.update(body)
    return h.hexdigest()


def preview(body: bytes, limit: int = PREVIEW_BYTES) -> str:
    """The start of a body as text for a person to read; the caller redacts it first."""
    text = body[:limit].decode("utf-8", "replace")
    return text + (f"\n… ({len(body) - limit} more bytes)" if len(body) > limit else "")


@dataclass(frozen=True)
class PendingApproval:
    id: str
    run: str
    runtime: str
    upstream: str
    purpose: str
    approvers: str  # "" = the security team only
    method: str
    path: str  # as in the audit line (credential-named query values masked)
    digest: str
    preview: str  # redacted
    size: int
    created: float
    deadline: float
    request_id: str
    state: str = "pending"
    decided_by: str = ""
    decided_at: float = 0.0
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_hash(cls, raw: dict[bytes, bytes]) -> PendingApproval:
        data = {k.decode(): v.decode("utf-8", "replace") for k, v in raw.items()}
        out: dict[str, Any] = {}
        for f in fields(cls):
            value = data.get(f.name, "")
            out[f.name] = (float(value or 0) if f.type in ("float", float) else
                           int(value or 0) if f.type in ("int", int) else value)
        return cls(**out)

    @property
    def open(self) -> bool:
        return self.state == "pending" and self.deadline > time.time()


def new_id() -> str:
    return "apr_" + os.urandom(12).hex()


def _unavailable(exc: Exception) -> Unavailable:
    return Unavailable(f"approval store unavailable: {type(exc).__name__}", Reason.REDIS_UNAVAILABLE)


class ApprovalStore:
    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client
        self._create: Any = client.register_script(_CREATE)
        self._decide: Any = client.register_script(_DECIDE)
        self._settle: Any = client.register_script(_SETTLE)

    async def create(self, approval: PendingApproval, cap: int) -> bool:
        """Record a pending approval; ``False`` when the run already has ``cap`` pending."""
        pairs: list[Any] = []
        for key, value in approval.to_json().items():
            pairs += [key, str(value)]
        ttl = int(approval.deadline - time.time()) + KEEP_AFTER
        try:
            done = await self._create(
                keys=[RUN_PREFIX + approval.run, PREFIX + approval.id, PENDING],
                args=[cap, approval.id, approval.deadline, ttl, *pairs])
        except (RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        return bool(done)

    async def get(self, approval_id: str) -> PendingApproval | None:
        if not approval_id.startswith("apr_") or len(approval_id) > 64:
            return None
        try:
            raw: Any = await self._redis.hgetall(PREFIX + approval_id)
        except (RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        return PendingApproval.from_hash(raw) if raw else None

    async def pending(self, limit: int = 500) -> list[PendingApproval]:
        """Open approvals, soonest deadline first (records whose deadline passed are left out)."""
        try:
            ids: Any = await self._redis.zrangebyscore(PENDING, time.time(), "+inf", start=0, num=limit)
            await self._redis.zremrangebyscore(PENDING, "-inf", time.time() - KEEP_AFTER)
            batch = self._redis.pipeline(transaction=False)
            for approval_id in ids:
                batch.hgetall(PREFIX + approval_id.decode())
            records: Any = await batch.execute() if ids else []
        except (RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        found = [PendingApproval.from_hash(raw) for raw in records if raw]
        return [a for a in found if a.open]

    async def decide(self, approval_id: str, approve: bool, digest: str, who: str,
                     why: str) -> PendingApproval:
        """A person's decision. Raises ``NotFound`` (no such approval), ``Conflict`` with
        ``approval_not_pending`` (already decided, timed out, cancelled) or
        ``approval_digest_mismatch`` (the request is not the one that was shown)."""
        state = "approved" if approve else "denied"
        try:
            answer: Any = await self._decide(
                keys=[PREFIX + approval_id, PENDING],
                args=[state, digest, who, time.time(), why[:500], CHANNEL, approval_id])
        except (RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        answer = answer.decode() if isinstance(answer, bytes) else str(answer)
        if answer == "missing":
            raise NotFound("no such approval", Reason.APPROVAL_NOT_FOUND)
        if answer == "digest_mismatch":
            raise Conflict("the digest does not match the held request: approve what you were shown, "
                           "by its digest", Reason.APPROVAL_DIGEST_MISMATCH)
        if answer != "ok":
            raise Conflict(f"this approval is {answer}, not pending", Reason.APPROVAL_NOT_PENDING,
                           state=answer)
        found = await self.get(approval_id)
        if found is None:
            raise NotFound("no such approval", Reason.APPROVAL_NOT_FOUND)
        return found

    async def settle(self, approval: PendingApproval, end_as: str = "", who: str = "") -> str:
        """The holder's step: ``approved`` (consumed now, once), ``denied``, ``pending`` (nothing
        yet; with ``end_as`` the pending record ends as that state: timeout, cancelled)."""
        try:
            answer: Any = await self._settle(
                keys=[PREFIX + approval.id, PENDING, RUN_PREFIX + approval.run],
                args=[approval.digest, end_as, who, time.time(), CHANNEL, approval.id])
        except (RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        return answer.decode() if isinstance(answer, bytes) else str(answer)

    async def cancel_run(self, run: str, who: str) -> list[str]:
        """End every pending approval of a revoked run (its holders are cut by the revocation
        itself; this makes the records say so even where no gateway holds them any more)."""
        try:
            ids: Any = await self._redis.smembers(RUN_PREFIX + run)
        except (RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        cancelled = []
        for raw in ids:
            found = await self.get(raw.decode())
            if found is not None and await self.settle(found, "cancelled", who) == "cancelled":
                cancelled.append(found.id)
        return cancelled
