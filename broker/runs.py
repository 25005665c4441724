"""The run registry in Redis: one JSON record per run, kept for ``KEEP_EXPIRED`` past its expiry.

An ended run keeps its record (state ``ended``) so that verification can say "ended" rather than
"unknown"; both deny. A run past its expiry reads as ``expired`` until the record is purged, and
``describe`` shows a revoked run as ``revoked`` with who and why. Redis errors become
``Unavailable(redis_unavailable)`` so every caller fails closed.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from contract import keys
from contract.claims import AccessClaims
from contract.errors import NotFound, Reason, TokenInvalid, Unavailable
from contract.revocations import Revocation, RevocationStore, Scope, key_of

KEY_PREFIX = keys.RUN_PREFIX
LIVE_INDEX = keys.RUNS_BY_EXPIRY  # run id → expiry (sorted set)
ACTIVE = "active"
ENDED = "ended"
EXPIRED = "expired"  # shown, never stored: an active run past its expiry
REVOKED = "revoked"  # shown, never stored: an ended run whose tokens a revocation refuses
KEEP_EXPIRED = 3600  # seconds a run's record outlives it, so `run show` can say "expired"
T = TypeVar("T")


def new_run_id() -> str:
    return "run_" + secrets.token_urlsafe(16)


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    runtime: str
    grants: list[dict[str, Any]]
    created: int
    expires: int
    state: str = ACTIVE
    ended_at: int | None = None
    ended_by: str | None = None
    audiences: list[str] = field(default_factory=list)
    vault_accessors: list[str] = field(default_factory=list)  # Vault tokens created for this run

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        return cls(**data)


async def _redis(call: Callable[[], Awaitable[T]]) -> T:
    try:
        return await call()
    except (RedisError, OSError) as exc:
        raise Unavailable(
            f"redis unavailable: {type(exc).__name__}", Reason.REDIS_UNAVAILABLE
        ) from None


class RunRegistry:
    def __init__(self, client: aioredis.Redis, clock: Callable[[], float] = time.time) -> None:
        self._redis = client
        self._clock = clock

    async def create(self, record: RunRecord) -> None:
        ttl = max(1, record.expires - int(self._clock())) + KEEP_EXPIRED
        payload = json.dumps(record.to_json())
        await _redis(lambda: self._redis.set(KEY_PREFIX + record.run_id, payload, ex=ttl, nx=True))
        # the console's live runs: an index by expiry, trimmed of what expired a day ago
        index = self._redis.pipeline(transaction=False)
        index.zadd(LIVE_INDEX, {record.run_id: record.expires})
        index.zremrangebyscore(LIVE_INDEX, "-inf", self._clock() - KEEP_EXPIRED)
        await _redis(index.execute)

    async def get(self, run_id: str) -> RunRecord | None:
        raw = await _redis(lambda: self._redis.get(KEY_PREFIX + run_id))
        if raw is None:
            return None
        try:
            return RunRecord.from_json(json.loads(raw))
        except (ValueError, TypeError):
            return None  # an unreadable record is treated as absent: deny

    async def end(self, run_id: str, by: str) -> RunRecord:
        """Mark a run ended (idempotent); its tokens stop verifying at once."""
        record = await self.get(run_id)
        if record is None:
            raise NotFound("no such run")
        if record.state == ENDED:
            return record
        ended = RunRecord(**{**record.to_json(), "state": ENDED,
                             "ended_at": int(self._clock()), "ended_by": by})
        key = KEY_PREFIX + run_id
        await _redis(lambda: self._redis.set(key, json.dumps(ended.to_json()), keepttl=True))
        return ended

    async def attach_vault_accessor(self, run_id: str, accessor: str) -> RunRecord:
        """Record a Vault token created for this run; ending the run revokes it."""
        record = await self.get(run_id)
        if record is None:
            raise NotFound("no such run")
        updated = RunRecord(**{**record.to_json(),
                               "vault_accessors": [*record.vault_accessors, accessor]})
        key = KEY_PREFIX + run_id
        await _redis(lambda: self._redis.set(key, json.dumps(updated.to_json()), keepttl=True))
        return updated

    async def require_live(self, claims: AccessClaims) -> None:
        """The run check for token verification: the run exists, is active, and matches."""
        record = await self.get(claims.sub)
        if record is None:
            raise TokenInvalid("token rejected: run is unknown or expired", check="run")
        if record.state != ACTIVE:
            raise TokenInvalid("token rejected: run has ended", check="run")
        if record.expires <= self._clock():
            raise TokenInvalid("token rejected: run has expired", check="run")
        if record.runtime != claims.client_id:
            raise TokenInvalid("token rejected: run belongs to another runtime", check="run")

    async def live(self, limit: int = 200) -> list[RunRecord]:
        """Up to ``limit`` unexpired run records (any state), newest first: the console's runs."""
        ids: Any = await _redis(partial(self._redis.zrevrangebyscore, LIVE_INDEX, "+inf", self._clock(),
                                        start=0, num=limit))
        # GETs in a pipeline, not one MGET: run records live in many slots of a Redis Cluster
        reads = self._redis.pipeline(transaction=False)
        for run_id in ids:
            reads.get(KEY_PREFIX + run_id.decode())
        values: Any = await _redis(reads.execute) if ids else []
        records = [RunRecord.from_json(json.loads(v)) for v in values if v]
        return sorted(records, key=lambda r: r.created, reverse=True)[:limit]

    async def ping(self) -> bool:
        try:
            return bool(await _redis(lambda: self._redis.ping()))
        except Unavailable:
            return False


async def describe(record: RunRecord, store: RevocationStore, now: float) -> dict[str, Any]:
    """What ``run show`` says: the record with its state as a person reads it.

    ``expired`` for an active run past its expiry; ``revoked`` with ``revoked_by``, ``revoked_at``
    and ``why`` when a revocation other than the runtime ending its own run refuses its tokens.
    """
    view = record.to_json()
    revocation = await store.get(key_of(Scope.RUN, record.run_id))
    if revocation is not None and _by_itself(record, revocation):
        revocation = None  # the runtime ended its own run (or the run itself, from the sandbox)
    revocation = revocation or _covering(record, (await store.load()).values())
    if revocation is not None:
        view.update(state=REVOKED, revoked_by=revocation.who, revoked_at=revocation.when,
                    why=revocation.why, revoked_scope=revocation.scope.value)
    elif record.state == ACTIVE and record.expires <= now:
        view["state"] = EXPIRED
    return view


def _by_itself(record: RunRecord, revocation: Revocation) -> bool:
    # `run end` with the runtime's token records the runtime; /.valetkey/end-run records "run:<id> (…)"
    return revocation.who == record.runtime or revocation.who.startswith(f"run:{record.run_id} ")


def _covering(record: RunRecord, revocations: Iterable[Revocation]) -> Revocation | None:
    """A runtime, upstream or global revocation that refuses the run's tokens, if any (an
    upstream revocation of a destination the run was granted, too)."""
    granted = {*record.audiences, *(str(g.get("upstream")) for g in record.grants)}
    for rev in revocations:
        hits = (rev.scope is Scope.ALL or (rev.scope is Scope.RUNTIME and rev.name == record.runtime)
                or (rev.scope is Scope.UPSTREAM and rev.name in granted))
        if hits and (rev.blocked or rev.not_before >= record.created):  # as Revocation.covers
            return rev
    return None
