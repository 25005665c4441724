"""Issued credentials the passthrough scanner refuses: this process's values (anywhere in the
data), every replica's published digests (a delimited token-shaped run), for as long as the
credential is valid; against a real redis-server."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from urllib.parse import quote

import pytest
import redis.asyncio as aioredis

from contract.secret import Secret
from gateways.credential_scan import CredentialScanner
from gateways.sources.base import IssuedCredential
from gateways.sources.issued import KEY, IssuedValues
from valetkey.dev.services import RedisServer

VALUE = "Zq7-opaque_Tok3n.v2~AbCdEfGh"
NOW = 1_000_000.0

SHAPES = [  # (data, found here, found by another replica)
    pytest.param(f"Bearer {VALUE}", True, True, id="bearer-header"),
    pytest.param(f"token={VALUE}&x=1", True, True, id="query-pair"),
    pytest.param(json.dumps({"note": VALUE}), True, True, id="json-string"),
    pytest.param(f"a.b {VALUE}\n", True, True, id="between-whitespace"),
    pytest.param(f"prefix{VALUE}", True, False, id="glued-to-a-word"),  # remote: delimited only
    pytest.param(VALUE[:-1], False, False, id="one-character-short"),
    pytest.param("nothing to see", False, False, id="absent"),
]


def credential(value: str = VALUE, expires: float = NOW + 300) -> IssuedCredential:
    return IssuedCredential(Secret(value), "oauth2_access_token", "expires", expires)


Check = Callable[[IssuedValues, IssuedValues, aioredis.Redis], Awaitable[None]]


def with_two_replicas(server: RedisServer, check: Check) -> None:
    """``check(here, there, client)`` once ``here`` issued ``VALUE`` and ``there`` read Redis."""

    async def scenario() -> None:
        client = aioredis.from_url(server.url, db=9)
        try:
            await client.delete(KEY)
            here = IssuedValues(client, clock=lambda: NOW)
            there = IssuedValues(client, clock=lambda: NOW)
            here.add(credential())
            await here.stop()  # the publication written
            await there.refresh()
            await check(here, there, client)
        finally:
            await client.aclose()

    asyncio.run(scenario())


@pytest.mark.parametrize(("data", "here_finds", "there_finds"), SHAPES)
def test_found_here_exactly_and_elsewhere_by_digest(redis_server: RedisServer, data: str, here_finds: bool,
                                                    there_finds: bool) -> None:
    async def check(here: IssuedValues, there: IssuedValues, _: aioredis.Redis) -> None:
        assert here.find(data.encode()) is here_finds
        assert there.find(data.encode()) is there_finds

    with_two_replicas(redis_server, check)


def test_the_scanner_refuses_it_in_each_place_it_decodes(redis_server: RedisServer) -> None:
    async def check(_: IssuedValues, there: IssuedValues, __: aioredis.Redis) -> None:
        scanner = CredentialScanner(issued=there)
        basic = base64.b64encode(f"x-access-token:{VALUE}".encode())
        assert scanner.scan_headers([(b"authorization", b"Basic " + basic)]) is not None
        found = scanner.scan_query(f"q={quote(VALUE, safe='')}".encode())
        assert found is not None
        assert (found.pattern, found.reason.value) == ("issued_credential", "credential_passthrough")
        assert scanner.scan_body(json.dumps({"k": VALUE}).encode(), "application/json") is not None
        assert scanner.scan_headers([(b"x-note", b"harmless")]) is None

    with_two_replicas(redis_server, check)


def test_known_until_revoked_or_expired(redis_server: RedisServer) -> None:
    async def scenario() -> None:
        now = [NOW]
        client = aioredis.from_url(redis_server.url, db=9)
        await client.delete(KEY)
        here = IssuedValues(client, clock=lambda: now[0])
        there = IssuedValues(client, clock=lambda: now[0])
        try:
            revoked, expiring = credential("revoked-" + VALUE), credential("expiring-" + VALUE, NOW + 10)
            here.add(revoked)
            here.add(expiring)
            here.discard(revoked)
            await here.stop()
            await there.refresh()
            assert [r.find(b"x revoked-" + VALUE.encode()) for r in (here, there)] == [False, False]
            assert [r.find(b"x expiring-" + VALUE.encode()) for r in (here, there)] == [True, True]
            now[0] = NOW + 10 + 61  # past expiry and the margin
            await here.refresh()
            await there.refresh()
            assert [r.find(b"x expiring-" + VALUE.encode()) for r in (here, there)] == [False, False]
            assert await client.zcard(KEY) == 0  # dropped from Redis too
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_no_value_in_redis_or_repr(redis_server: RedisServer) -> None:
    async def check(here: IssuedValues, there: IssuedValues, client: aioredis.Redis) -> None:
        members = await client.zrange(KEY, 0, -1)
        assert members
        assert all(VALUE.encode() not in m for m in members)
        assert VALUE not in repr(here) + repr(there)

    with_two_replicas(redis_server, check)
