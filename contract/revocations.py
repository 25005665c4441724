"""Revocation: the truth in Redis, an in-memory copy in every gateway, one rule to evaluate.

A revocation has a scope: ``run:<id>``, ``runtime:<name>``, ``upstream:<name>`` or ``all``.

* A run revocation denies every token of that run until the run expires.
* A runtime, upstream or global revocation *blocks*: while it stands, every matching token is
  denied and the broker mints nothing that matches. Lifting it is explicit; tokens issued at or
  before the revocation (``not_before``) stay denied even after the lift.

Redis holds one hash ``{vk:rev}:revocations`` (scope → JSON record; ``contract/keys.py``) and
announces every change on the channel ``valetkey:revocations``, in one Lua script (atomic, and one
slot on a Redis Cluster). Records are kept until the longest token they cover has expired.

Reading the hash fails closed, field by field. The field (``run:<id>``, ``runtime:<name>``,
``upstream:<name>``, ``all``) says what a record covers; every lookup goes by field, and valetkey
writes each record under its own field. So:

* a field that names a scope, with a value that does not parse or names another field: a block of
  that field's scope (``unreadable revocation record``), never "not revoked". The broker's reaper
  rewrites it as a proper record, which an admin can then see and lift;
* a field that names no scope: no lookup can reach it and valetkey never writes one, so it revokes
  nothing; it is ignored and the reaper deletes it;
* a runtime or upstream no longer in policy: kept (it covers nothing the broker will mint) until
  ``UNKNOWN_GRACE`` after its last change, then the reaper deletes it. The grace outlasts a rolling
  deploy in which a replica on the newer policy may have just written it.
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

from contract import generation, keys
from contract.claims import MAX_LEEWAY, AccessClaims
from contract.errors import BadRequest, NotFound, Reason, TokenInvalid, Unavailable
from policies.model import PolicySet

HASH = keys.REVOCATIONS
CHANNEL = keys.REVOCATION_CHANNEL
MAX_TOKEN_LIFETIME = 24 * 3600  # policies cap run TTLs at 24h, the verifier refuses longer tokens
UNKNOWN_GRACE = MAX_TOKEN_LIFETIME  # a record of a target not in policy is kept this long
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "scope": (str,), "name": (str,), "who": (str,), "why": (str,), "when": (int, float),
    "not_before": (int,), "blocked": (bool,), "lifted_by": (str,), "lifted_at": (int, float),
    "expires": (int, float),
}
_REQUIRED = frozenset({"scope", "name", "who", "why", "when", "not_before"})
# KEYS[1] the hash; ARGV: field, the value read, the new value ("" deletes), the channel.
# Changes a field only if nobody wrote it since it was read (a revoke racing the reaper wins).
_REPLACE_IF_UNCHANGED = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
if ARGV[3] == '' then redis.call('HDEL', KEYS[1], ARGV[1]) return 1 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[3])
return 1
"""

# KEYS[1] the hash; ARGV: field, record, channel. Writes and announces (a revoke, a lift).
_PUT = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[2])
return 1
"""

# KEYS[1] the hash; ARGV: field, record, channel. Writes and announces only an empty field.
_RESTORE = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('PUBLISH', ARGV[3], ARGV[2])
  return 1
end
return 0
"""


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

    def covers(self, claims: AccessClaims, target: str = "") -> bool:
        """``target``: the upstream or destination a proxy token is being used for (the proxy
        token's audience is the proxy's; an upstream revocation covers the name it is used at)."""
        if self.scope is Scope.RUN:
            return claims.sub == self.name
        matches = (
            self.scope is Scope.ALL
            or (self.scope is Scope.RUNTIME and claims.client_id == self.name)
            or (self.scope is Scope.UPSTREAM and self.name in (claims.aud, target))
        )
        return matches and (self.blocked or claims.iat <= self.not_before)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Revocation:
        """A record as valetkey writes it; anything else raises ``ValueError``."""
        data: Any = json.loads(raw)
        if not isinstance(data, dict) or not _REQUIRED <= set(data) <= set(_FIELD_TYPES):
            raise ValueError("not a revocation record")
        for key, value in data.items():
            numeric = int in _FIELD_TYPES[key]
            if not isinstance(value, _FIELD_TYPES[key]) or (numeric and isinstance(value, bool)):
                raise ValueError(f"revocation record field {key!r} has the wrong type")
        data["scope"] = Scope(data["scope"])
        if (data["scope"] is Scope.ALL) != (not data["name"]):
            raise ValueError("a revocation names its run, runtime or upstream (and nothing for all)")
        return cls(**data)


def key_of(scope: Scope, name: str) -> str:
    return "all" if scope is Scope.ALL else f"{scope.value}:{name}"


def scope_of(field: str) -> tuple[Scope, str] | None:
    """The (scope, name) a hash field names, or None if it names none."""
    if field == "all":
        return Scope.ALL, ""
    kind, _, name = field.partition(":")
    if kind not in (Scope.RUN, Scope.RUNTIME, Scope.UPSTREAM) or not name:
        return None
    return Scope(kind), name


def in_policy(policies: PolicySet) -> Callable[[Scope, str], bool]:
    """Does a runtime or upstream revocation name one in ``policies``? (Runs and all: always.)
    An upstream revocation may name a destination: one namespace, ``revoke upstream NAME``."""
    def known(scope: Scope, name: str) -> bool:
        if scope is Scope.RUNTIME:
            return name in policies.runtimes
        return scope is not Scope.UPSTREAM or policies.target(name) is not None
    return known


def unreadable(field: str, now: float | None = None) -> Revocation | None:
    """Fail closed: the block an unreadable value of ``field`` stands for (None: no scope)."""
    target = scope_of(field)
    if target is None:
        return None
    return new_revocation(*target, "valetkey", f"unreadable revocation record {field[:200]!r}", now=now)


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
            if expired(record, now):
                del self._records[key]

    def find(self, claims: AccessClaims, target: str = "") -> Revocation | None:
        """The revocation covering ``claims``; with ``target`` (the proxy, judging a request to
        one upstream or destination) also one of that name."""
        if not self._records:  # the usual case: nothing revoked that is still in force
            return None
        keys = [key_of(Scope.RUN, claims.sub), key_of(Scope.RUNTIME, claims.client_id),
                key_of(Scope.UPSTREAM, claims.aud), "all"]
        if target and target != claims.aud:
            keys.append(key_of(Scope.UPSTREAM, target))
        for key in keys:
            record = self._records.get(key)
            if record is not None and record.covers(claims, target):
                return record
        return None

    def check(self, claims: AccessClaims, target: str = "") -> None:
        record = self.find(claims, target)
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


def expired(record: Revocation, now: float) -> bool:
    if record.scope is Scope.RUN:
        # a verifier accepts the run's tokens until exp + its leeway: keep the record that long
        return record.expires + MAX_LEEWAY < now
    return not record.blocked and record.lifted_at + MAX_TOKEN_LIFETIME < now


async def _redis(call: Callable[[], Any]) -> Any:
    try:
        return await call()
    except (RedisError, OSError) as exc:
        raise Unavailable(f"redis unavailable: {type(exc).__name__}", Reason.REDIS_UNAVAILABLE) from None


class RevocationStore:
    """Reads and writes the truth in Redis and announces every change."""

    def __init__(self, client: aioredis.Redis, *, require_generation: bool = False) -> None:
        self._redis = client
        # the broker's store: no generation marker means Redis lost the revocations and no broker
        # restored them yet (contract/generation.py), so nothing may be minted on what it says
        self._require_generation = require_generation

    async def load(self) -> dict[str, Revocation]:
        raw: dict[bytes, bytes] = await _redis(lambda: self._redis.hgetall(HASH))
        out: dict[str, Revocation] = {}
        for key, value in raw.items():
            record = self._parse(key, value)
            if record is not None:
                out[record.key] = record
        return out

    async def snapshot(self) -> RevocationSet:
        records = await self.load()
        current = RevocationSet(records.values())
        current.forget_expired(time.time())
        return current

    async def put(self, record: Revocation) -> Revocation:
        script = self._redis.register_script(_PUT)
        await _redis(lambda: script(keys=[HASH], args=[record.key, record.to_json(), CHANNEL]))
        return record

    async def restore(self, records: Mapping[str, str]) -> int:
        """Write back records (field → JSON) where the field is empty, announcing each; never over
        a record Redis holds (it may be newer). Returns how many were written."""
        script = self._redis.register_script(_RESTORE)
        written = 0
        for field, raw in records.items():
            args = [field, raw, CHANNEL]
            written += int(await _redis(lambda: script(keys=[HASH], args=args)))  # noqa: B023 - awaited now
        return written

    async def get(self, key: str) -> Revocation | None:
        raw = await _redis(lambda: self._redis.hget(HASH, key))
        return None if raw is None else self._parse(key, raw)

    async def blocking(self, runtime: str, upstreams: Iterable[str]) -> Revocation | None:
        """The standing block (if any) that forbids minting: reads only the keys concerned."""
        keys = ["all", key_of(Scope.RUNTIME, runtime), *(key_of(Scope.UPSTREAM, u) for u in upstreams)]
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hmget(HASH, keys)
            pipe.get(generation.KEY)
            values, marker = await _redis(pipe.execute)
        if self._require_generation and generation.parse(marker) is None:
            raise Unavailable("the revocation state in Redis was lost and is not restored yet",
                              Reason.REVOCATION_STATE_STALE)
        records = [self._parse(k, v) for k, v in zip(keys, values, strict=True) if v is not None]
        return RevocationSet(r for r in records if r is not None).blocking(runtime, upstreams)

    @staticmethod
    def _parse(key: str | bytes, value: str | bytes) -> Revocation | None:
        """The record under ``key``; a block of that field's scope if the value is unreadable or
        names another field (fail closed); None if the field names no scope (see the module)."""
        field = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        try:
            record = Revocation.from_json(value)
        except (ValueError, TypeError, KeyError):
            return unreadable(field)
        return record if record.key == field else unreadable(field)

    async def revoke(self, record: Revocation) -> Revocation:
        existing = await self.get(record.key)
        if existing is not None and existing.scope is not Scope.RUN:
            # revoking again while a record exists: block again and cover every token issued up to now
            record = replace(record, not_before=max(existing.not_before, record.not_before))
        return await self.put(record)

    async def lift(self, scope: Scope, name: str, who: str) -> Revocation:
        """Lift a standing record. Nothing standing: ``404 revocation_not_found`` and nothing is
        written (a lifted record of nothing would revoke every token issued up to now). A replica
        still blocking from memory after Redis lost the record is released by revoking the same
        scope again, then lifting it."""
        if scope is Scope.RUN:
            raise BadRequest("a run revocation cannot be lifted; mint a new run", Reason.INVALID_REQUEST)
        if (scope is Scope.ALL) != (not name):
            raise BadRequest("name the runtime or upstream (and nothing for all)", Reason.INVALID_REQUEST)
        existing = await self.get(key_of(scope, name))
        if existing is None or not existing.blocked:
            raise NotFound(f"no standing revocation of {key_of(scope, name)}", Reason.REVOCATION_NOT_FOUND)
        return await self.put(replace(existing, blocked=False, lifted_by=who, lifted_at=time.time()))

    async def purge(self, known: Callable[[Scope, str], bool] | None = None,
                    now: float | None = None) -> dict[str, int]:
        """One pass over the hash (see the module): delete expired records, fields that name no
        scope, and records of runtimes or upstreams ``known`` rejects once ``UNKNOWN_GRACE`` old;
        rewrite unreadable values as proper blocks of their field's scope. Each change applies only
        if the field still holds what was read. Returns the count of each."""
        raw: dict[bytes, bytes] = await _redis(lambda: self._redis.hgetall(HASH))
        moment = time.time() if now is None else now
        counts = {"expired": 0, "no_scope": 0, "unknown_target": 0, "rewritten": 0}
        for key, value in raw.items():
            field = key.decode("utf-8", "replace")
            outcome, replacement = _purge_decision(field, value, known, moment)
            if outcome and await self._replace(key, value, replacement):
                counts[outcome] += 1
        return counts

    async def _replace(self, key: bytes, old: bytes, new: str) -> bool:
        script = self._redis.register_script(_REPLACE_IF_UNCHANGED)
        return bool(await _redis(lambda: script(keys=[HASH], args=[key, old, new, CHANNEL])))


def _purge_decision(field: str, value: bytes, known: Callable[[Scope, str], bool] | None,
                    now: float) -> tuple[str, str]:
    """(what to count, the new value: "" deletes); ("", "") keeps the field as it is."""
    block = unreadable(field, now)
    if block is None:
        return "no_scope", ""
    try:
        record = Revocation.from_json(value)
    except (ValueError, TypeError, KeyError):
        record = None
    if record is None or record.key != field:
        return "rewritten", block.to_json()
    if expired(record, now):
        return "expired", ""
    if (known is not None and record.scope in (Scope.RUNTIME, Scope.UPSTREAM)
            and not known(record.scope, record.name)
            and max(record.when, record.lifted_at) + UNKNOWN_GRACE < now):
        return "unknown_target", ""
    return "", ""
