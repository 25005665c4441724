"""The revocation hash read fail-closed field by field, lifting only what stands, and the purge of
junk, against a real redis-server of its own (the other tests' hash and channel are untouched).

Live broker and gateways: ``tests/gateways/test_revocation.py``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from contract.claims import MAX_LEEWAY
from contract.errors import BadRequest, NotFound, Reason
from contract.revocations import (
    CHANNEL,
    HASH,
    UNKNOWN_GRACE,
    Revocation,
    RevocationSet,
    RevocationStore,
    Scope,
    new_revocation,
    scope_of,
)
from valetkey.dev.services import RedisServer

NOW = 1_800_000_000.0


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this module's own: revocations are announced on a pub/sub channel, which
    Redis shares across databases, so a garbled block published here would reach (and, since
    watchers write back what they hold, be stored by) every gateway of the session's server."""
    with RedisServer() as server:
        yield server


@pytest.fixture
async def client(own_redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    redis = aioredis.Redis.from_url(own_redis.url)
    await redis.delete(HASH)
    try:
        yield redis
    finally:
        await redis.delete(HASH)
        await redis.aclose()


def record(scope: Scope, target: str, **changes: Any) -> dict[str, Any]:
    base = json.loads(new_revocation(scope, target, "admin:x", "test", now=NOW).to_json())
    return {**base, **changes}


@pytest.mark.parametrize(("field", "expected"), [
    pytest.param("all", (Scope.ALL, ""), id="all"),
    pytest.param("run:run_a", (Scope.RUN, "run_a"), id="run"),
    pytest.param("runtime:tester", (Scope.RUNTIME, "tester"), id="runtime"),
    pytest.param("upstream:echo", (Scope.UPSTREAM, "echo"), id="upstream"),
    pytest.param("upstream:", None, id="no-name"),
    pytest.param("all:x", None, id="all-with-name"),
    pytest.param("ALL", None, id="case"),
    pytest.param("bogus", None, id="no-scope"),
    pytest.param("user:x", None, id="unknown-scope"),
])
def test_scope_of(field: str, expected: tuple[Scope, str] | None) -> None:
    assert scope_of(field) == expected


# (field, stored value, what the set holds for that field: None = nothing, else (scope key, blocked, why))
READS = [
    pytest.param("runtime:tester", json.dumps(record(Scope.RUNTIME, "tester")), ("runtime:tester", "test"),
                 id="well-formed"),
    pytest.param("runtime:tester", "{not json", ("runtime:tester", "unreadable"), id="garbled-value"),
    pytest.param("runtime:tester", json.dumps(record(Scope.RUNTIME, "tester", not_before="0")),
                 ("runtime:tester", "unreadable"), id="wrong-type"),
    pytest.param("runtime:tester", json.dumps(record(Scope.RUNTIME, "tester", blocked=1)),
                 ("runtime:tester", "unreadable"), id="number-for-bool"),
    pytest.param("runtime:tester", json.dumps(record(Scope.RUNTIME, "tester", extra=1)),
                 ("runtime:tester", "unreadable"), id="unknown-member"),
    pytest.param("runtime:tester", json.dumps(record(Scope.ALL, "")), ("runtime:tester", "unreadable"),
                 id="value-names-another-field"),
    pytest.param("runtime:tester", json.dumps([1, 2]), ("runtime:tester", "unreadable"), id="not-an-object"),
    pytest.param("run:run_a", "garbage", ("run:run_a", "unreadable"), id="garbled-run"),
    pytest.param("all", json.dumps(record(Scope.ALL, "", name="x")), ("all", "unreadable"),
                 id="all-with-a-name"),
    pytest.param("bogus", json.dumps(record(Scope.ALL, "")), None, id="no-scope-field-ignored"),
    pytest.param("bogus", "garbage", None, id="no-scope-garbage-ignored"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("field", "value", "held"), READS)
async def test_load_fails_closed_field_by_field(client: aioredis.Redis, field: str, value: str,
                                                held: tuple[str, str] | None) -> None:
    await client.hset(HASH, field, value)
    loaded = await RevocationStore(client).load()
    if held is None:
        assert loaded == {}
        return
    key, why = held
    assert list(loaded) == [key]
    assert loaded[key].blocked
    assert why in loaded[key].why


@pytest.mark.anyio
async def test_a_garbled_block_still_stops_minting(client: aioredis.Redis) -> None:
    await client.hset(HASH, "upstream:echo", "{")
    blocking = await RevocationStore(client).blocking("tester", ["echo"])
    assert blocking is not None
    assert blocking.key == "upstream:echo"


LIFTS = [
    pytest.param(Scope.ALL, "", None, NotFound, Reason.REVOCATION_NOT_FOUND, id="all-without-record"),
    pytest.param(Scope.UPSTREAM, "echo", None, NotFound, Reason.REVOCATION_NOT_FOUND, id="without-record"),
    pytest.param(Scope.UPSTREAM, "echo", record(Scope.UPSTREAM, "echo", blocked=False, lifted_by="a",
                                                lifted_at=NOW), NotFound, Reason.REVOCATION_NOT_FOUND,
                 id="already-lifted"),
    pytest.param(Scope.RUN, "run_a", record(Scope.RUN, "run_a"), BadRequest, Reason.INVALID_REQUEST, id="run"),
    pytest.param(Scope.ALL, "x", record(Scope.ALL, ""), BadRequest, Reason.INVALID_REQUEST, id="all-with-name"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("scope", "name", "stored", "error", "reason"), LIFTS)
async def test_lift_refusals_write_nothing(client: aioredis.Redis, scope: Scope, name: str,
                                           stored: dict[str, Any] | None, error: type[Exception],
                                           reason: Reason) -> None:
    field = "all" if scope is Scope.ALL else f"{scope.value}:{name}"
    if stored is not None:
        await client.hset(HASH, field, json.dumps(stored))
    before = await client.hgetall(HASH)
    with pytest.raises(error) as info:
        await RevocationStore(client).lift(scope, name, "admin:x")
    assert info.value.reason is reason  # type: ignore[attr-defined]
    assert await client.hgetall(HASH) == before


@pytest.mark.anyio
async def test_lifting_an_unreadable_block_writes_a_proper_lifted_record(client: aioredis.Redis) -> None:
    await client.hset(HASH, "runtime:tester", "{")
    lifted = await RevocationStore(client).lift(Scope.RUNTIME, "tester", "admin:x")
    stored = Revocation.from_json(await client.hget(HASH, "runtime:tester"))
    assert stored == lifted
    assert (stored.blocked, stored.lifted_by) == (False, "admin:x")


def known(scope: Scope, name: str) -> bool:
    return name in {"tester", "echo"}


@pytest.mark.anyio
async def test_purge(client: aioredis.Redis) -> None:
    old = NOW - UNKNOWN_GRACE - 60
    fields = {
        "runtime:tester": json.dumps(record(Scope.RUNTIME, "tester")),  # real: kept
        "upstream:echo": "{garbled",  # real scope, unreadable: rewritten as a block
        "bogus": json.dumps(record(Scope.ALL, "")),  # names no scope: deleted
        "upstream:gone": json.dumps(record(Scope.UPSTREAM, "gone", when=old)),  # not in policy, old: deleted
        "runtime:new": json.dumps(record(Scope.RUNTIME, "new", when=NOW - 60)),  # not in policy, recent: kept
        "run:run_old": json.dumps(record(Scope.RUN, "run_old", expires=NOW - MAX_LEEWAY - 1)),  # expired: deleted
        "run:run_live": json.dumps(record(Scope.RUN, "run_live", expires=NOW + 60)),  # kept
    }
    await client.hset(HASH, mapping=fields)
    pubsub = client.pubsub()
    await pubsub.subscribe(CHANNEL)
    counts = await RevocationStore(client).purge(known, now=NOW)
    assert counts == {"expired": 1, "no_scope": 1, "unknown_target": 1, "rewritten": 1}
    stored = {k.decode(): v for k, v in (await client.hgetall(HASH)).items()}
    assert set(stored) == {"runtime:tester", "upstream:echo", "runtime:new", "run:run_live"}
    rewritten = Revocation.from_json(stored["upstream:echo"])
    assert (rewritten.key, rewritten.blocked, rewritten.who) == ("upstream:echo", True, "valetkey")
    published = None
    for _ in range(50):
        published = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
        if published is not None:
            break
    await pubsub.aclose()  # type: ignore[no-untyped-call]
    assert published is not None
    assert Revocation.from_json(published["data"]) == rewritten  # gateways hear of it
    assert await RevocationStore(client).purge(known, now=NOW) == dict.fromkeys(counts, 0)


@pytest.mark.anyio
async def test_purge_never_deletes_what_was_rewritten_meanwhile(client: aioredis.Redis) -> None:
    """Compare and delete: a revoke landing between the read and the delete survives."""
    store = RevocationStore(client)
    await client.hset(HASH, "run:run_a", json.dumps(record(Scope.RUN, "run_a", expires=NOW - MAX_LEEWAY - 1)))
    fresh = new_revocation(Scope.RUN, "run_a", "admin:x", "again", run_expires=time.time() + 60)
    stale = await client.hget(HASH, "run:run_a")
    await store.put(fresh)
    assert not await store._replace(b"run:run_a", stale, "")
    assert Revocation.from_json(await client.hget(HASH, "run:run_a")) == fresh


@pytest.mark.parametrize(("past_exp", "kept"), [
    pytest.param(1, True, id="within-the-leeway"),
    pytest.param(MAX_LEEWAY - 1, True, id="at-the-longest-leeway"),
    pytest.param(MAX_LEEWAY + 1, False, id="past-every-leeway"),
])
def test_a_run_revocation_outlives_its_tokens_leeway(past_exp: int, kept: bool) -> None:
    """A verifier accepts a token until exp + its leeway: a replica resyncing in that window must
    still hold the revocation, or a revoked run's token works again."""
    revocation = new_revocation(Scope.RUN, "run_x", "admin:x", "why", run_expires=NOW - past_exp)
    current = RevocationSet([revocation])
    current.forget_expired(NOW)
    assert any(r.name == "run_x" for r in current.records()) is kept


def _proxy_claims(iat: int = 1000) -> Any:
    from contract.claims import AccessClaims, GrantClaim, params_view

    return AccessClaims(iss="i", sub="run_x", aud="egress", exp=iat + 60, nbf=iat, iat=iat, jti="j",
                        client_id="coding-agent", grants=(GrantClaim("pypi/connect", params_view({})),))


@pytest.mark.parametrize(
    ("revoked", "target", "covered"),
    [
        pytest.param("pypi", "pypi", True, id="destination-revoked-used-there"),
        pytest.param("pypi", "python-docs", False, id="destination-revoked-used-elsewhere"),
        pytest.param("pypi", "", False, id="destination-revoked-no-target"),
        pytest.param("egress", "", True, id="the-proxy-audience-itself"),
        pytest.param("openai", "openai", True, id="upstream-revoked-used-through-the-proxy"),
    ],
)
def test_an_upstream_revocation_covers_a_proxy_token_at_that_name(revoked: str, target: str,
                                                                   covered: bool) -> None:
    from contract.revocations import RevocationSet, new_revocation

    claims = _proxy_claims()
    revocations = RevocationSet([new_revocation(Scope.UPSTREAM, revoked, "sec", "t", now=2000)])

    assert (revocations.find(claims, target) is not None) is covered
    if covered:
        from contract.errors import TokenInvalid

        with pytest.raises(TokenInvalid) as info:
            revocations.check(claims, target)
        assert info.value.code == "token_revoked"
