"""Revocation: the truth in Redis, an in-memory copy in every gateway, one rule to evaluate.

A revocation has a scope: ``run:<id>``, ``runtime:<name>``, ``upstream:<name>`` or ``all``.

* A run revocation denies every token of that run until the run expires.
* A runtime, upstream or global revocation *blocks*: while it stands, every matching token is
  denied and the broker mints nothing that matches. Lifting it is explicit; tokens issued at or
  before the revocation (``not_before``) stay denied even after the lift.

Redis holds one hash ``valetkey:revocations`` (scope → JSON record) and announces every change on
the channel of the same name. Records are kept until the longest token they cover has expired.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from contract.claims import AccessClaims
from contract.errors import BadRequest, NotFound, Reason, TokenInvalid, Unavailable

HASH = "valetkey:revocations"
CHANNEL = "valetkey:revocations"
MAX_TOKEN_LIFETIME = 24 * 3600  # policies cap run TTLs at 24h, the verifier refuses longer tokens


class Scope(StrEnum):
    RUN = "run"
    RUNTIME = "runtime"
    UPSTREAM = "upstream"
    ALL = "all"


@dataclass(frozen=True)
class Revocation:
    scope: Scope
    name: str  # run id, runtime or upstream name; "" for ALL
    who: str
    why: str
    when: float
    not_before: int  # tokens with iat <= not_before are revoked
    blocked: bool = True
    lifted_by: str = ""
    lifted_at: float = 0.0
    expires: float = 0.0  # the record may be forgotten after this

    @property
    def key(self) -> str:
        return key_of(self.scope, self.name)

    def covers(self, claims: AccessClaims) -> bool:
        if self.scope is Scope.RUN:
            return claims.sub == self.name
        matches = (
            self.scope is Scope.ALL
            or (self.scope is Scope.RUNTIME and claims.client_id == self.name)
            or (self.scope is Scope.UPSTREAM and claims.aud == self.name)
        )
        return matches and (self.blocked or claims.iat <= self.not_before)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Revocation:
        data: dict[str, Any] = json.loads(raw)
        data["scope"] = Scope(data["scope"])
        return cls(**data)


def key_of(scope: Scope, name: str) -> str:
    return "all" if scope is Scope.ALL else f"{scope.value}:{name}"


def new_revocation(scope: Scope, name: str, who: str, why: str, run_expires: float | None = None,
                   now: float | None = None) -> Revocation:
    if (scope is Scope.ALL) != (not name):
        raise BadRequest("name the run, runtime or upstream (and nothing for all)", Reason.INVALID_REQUEST)
    moment = time.time() if now is None else now
    expires = (run_expires or moment + MAX_TOKEN_LIFETIME) if scope is Scope.RUN else 0.0
    return Revocation(scope=scope, name=name, who=who, why=why[:500], when=moment,
                      not_before=int(moment), expires=expires)


class RevocationSet:
    """An in-memory snapshot, evaluated on the request path without I/O."""

    def __init__(self, records: Iterable[Revocation] = ()) -> None:
        self._records: dict[str, Revocation] = {r.key: r for r in records}

    def __len__(self) -> int:
        return len(self._records)

    def records(self) -> list[Revocation]:
        return list(self._records.values())

    def apply(self, record: Revocation) -> None:
        self._records[record.key] = record

    def merge(self, records: Mapping[str, Revocation]) -> None:
        """Resync: take Redis's records; keep local ones Redis no longer has (fail closed if Redis
        lost data) until they expire."""
        for key, record in records.items():
            self._records[key] = record

    def forget_expired(self, now: float) -> None:
        for key, record in list(self._records.items()):
            if _expired(record, now):
                del self._records[key]

    def find(self, claims: AccessClaims) -> Revocation | None:
        if not self._records:  # the usual case: nothing revoked that is still in force
            return None
        for key in (key_of(Scope.RUN, claims.sub), key_of(Scope.RUNTIME, claims.client_id),
                    key_of(Scope.UPSTREAM, claims.aud), "all"):
            record = self._records.get(key)
            if record is not None and record.covers(claims):
                return record
        return None

    def check(self, claims: AccessClaims) -> None:
        record = self.find(claims)
        if record is not None:
            where = "run" if record.scope is Scope.RUN else f"{record.scope.value} {record.name}".strip()
            raise TokenInvalid(f"token revoked ({where}): {record.why}", check="revoked",
                               reason=Reason.TOKEN_REVOKED)

    def blocking(self, runtime: str, upstreams: Iterable[str]) -> Revocation | None:
        """The standing block that forbids minting for ``runtime`` at any of ``upstreams``."""
        keys = ["all", key_of(Scope.RUNTIME, runtime), *(key_of(Scope.UPSTREAM, u) for u in upstreams)]
        for key in keys:
            record = self._records.get(key)
            if record is not None and record.blocked:
                return record
        return None


def _expired(record: Revocation, now: float) -> bool:
    if record.scope is Scope.RUN:
        return record.expires < now
    return not record.blocked and record.lifted_at + MAX_TOKEN_LIFETIME < now


async def _redis(call: Callable[[], Any]) -> Any:
    try:
        return await call()
    except (RedisError, OSError) as exc:
        raise Unavailable(f"redis unavailable: {type(exc).__name__}", Reason.REDIS_UNAVAILABLE) from None


class RevocationStore:
    """Reads and writes the truth in Redis and announces every change."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client

    async def load(self) -> dict[str, Revocation]:
        raw: dict[bytes, bytes] = await _redis(lambda: self._redis.hgetall(HASH))
        out: dict[str, Revocation] = {}
        for key, value in raw.items():
            record = self._parse(key, value)
            out[record.key] = record
        return out

    async def snapshot(self) -> RevocationSet:
        records = await self.load()
        current = RevocationSet(records.values())
        current.forget_expired(time.time())
        return current

    async def put(self, record: Revocation) -> Revocation:
        payload = record.to_json()
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(HASH, record.key, payload)
            pipe.publish(CHANNEL, payload)
            await _redis(pipe.execute)
        return record

    async def get(self, key: str) -> Revocation | None:
        raw = await _redis(lambda: self._redis.hget(HASH, key))
        return None if raw is None else self._parse(key, raw)

    async def blocking(self, runtime: str, upstreams: Iterable[str]) -> Revocation | None:
        """The standing block (if any) that forbids minting: reads only the keys concerned."""
        keys = ["all", key_of(Scope.RUNTIME, runtime), *(key_of(Scope.UPSTREAM, u) for u in upstreams)]
        values = await _redis(lambda: self._redis.hmget(HASH, keys))
        records = [self._parse(k, v) for k, v in zip(keys, values, strict=True) if v is not None]
        return RevocationSet(records).blocking(runtime, upstreams)

    @staticmethod
    def _parse(key: str | bytes, value: str | bytes) -> Revocation:
        try:
            return Revocation.from_json(value)
        except (ValueError, TypeError, KeyError):
            # unreadable: treat it as a block on everything rather than ignore it (fail closed)
            return new_revocation(Scope.ALL, "", "valetkey", f"unreadable revocation record {key!r}")

    async def revoke(self, record: Revocation) -> Revocation:
        existing = await self.get(record.key)
        if existing is not None and existing.scope is not Scope.RUN:
            # revoking again while a record exists: block again and cover every token issued up to now
            record = replace(record, not_before=max(existing.not_before, record.not_before))
        return await self.put(record)

    async def lift(self, scope: Scope, name: str, who: str) -> Revocation:
        """Lift explicitly. With no record (Redis lost it) a lifted record is written anyway, so
        replicas still blocking from memory are released; tokens up to now stay revoked."""
        if scope is Scope.RUN:
            raise BadRequest("a run revocation cannot be lifted; mint a new run", Reason.INVALID_REQUEST)
        existing = await self.get(key_of(scope, name))
        if existing is not None and not existing.blocked:
            raise NotFound(f"no standing revocation of {key_of(scope, name)}")
        base = existing or new_revocation(scope, name, who, "lifted without a record (state was lost)")
        return await self.put(replace(base, blocked=False, lifted_by=who, lifted_at=time.time()))

    async def purge_expired(self) -> int:
        now = time.time()
        stale = [k for k, r in (await self.load()).items() if _expired(r, now)]
        if stale:
            await _redis(lambda: self._redis.hdel(HASH, *stale))
        return len(stale)
