"""broker/revocation_keeper.py against a real OpenBao (the broker's own policy) and Redis: the
durable copy is written, restored into an emptied Redis before a generation starts, kept in step
with records others wrote, and pruned when they expire."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from broker.revocation_keeper import MOUNT, PREFIX, RevocationKeeper, entry, field_of
from contract import generation, keys
from contract.errors import Reason, Unavailable
from contract.revocations import HASH, RevocationStore, Scope, new_revocation
from contract.secret import Secret
from contract.vault import VaultClient
from valetkey.dev.services import RedisServer


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with RedisServer() as server:
        yield server.url


def test_copy_restore_sync_prune(bootstrapped_vault: Any, redis_url: str) -> None:
    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        # several addresses: the first is not listening, the client goes on to the next
        vault = VaultClient(f"http://127.0.0.1:9,{bootstrapped_vault.addr}",
                            Secret(bootstrapped_vault.broker_token))
        keeper = RevocationKeeper(client, vault)
        store = RevocationStore(client, require_generation=True)
        try:
            await client.flushall()
            with pytest.raises(Unavailable) as stale:  # no marker: the broker mints nothing
                await store.blocking("tester", ["echo"])
            assert stale.value.reason is Reason.REVOCATION_STATE_STALE
            first = await keeper.check()  # nothing to restore yet: the generation starts
            blocked = new_revocation(Scope.RUNTIME, f"rt-{time.time_ns()}", "admin", "test")
            await store.put(blocked)
            await keeper.save(blocked)
            # written by a gateway (auto-revoke): Redis only, until the keeper's sync
            by_gateway = new_revocation(Scope.RUN, f"run-{time.time_ns()}", "gateway", "alert")
            await store.put(by_gateway)
            assert await keeper.sync() >= 1
            # an expired run record in Vault is pruned
            old = new_revocation(Scope.RUN, f"old-{time.time_ns()}", "admin", "old", run_expires=1.0)
            await keeper.save(old)
            await keeper.sync()
            assert await vault.kv_get(MOUNT, f"{PREFIX}/{old.key}") is None

            await client.flushall()  # the data is lost
            second = await keeper.check()
            assert second.id != first.id
            assert keeper.restored >= 2
            assert await client.hexists(HASH, blocked.key)
            assert await client.hexists(HASH, by_gateway.key)
            assert not await client.hexists(HASH, old.key)
            block = await store.blocking(blocked.name, ["echo"])
            assert block is not None
            assert block.key == blocked.key
            # a failover to a replica that missed the last write: the marker is there, the record is
            # not; the next sync writes it back (never a record the policy no longer names, once old)
            await client.hdel(HASH, blocked.key)
            await keeper.sync()
            assert await client.hexists(HASH, blocked.key)
            # a newer record in Redis is never overwritten by the copy
            lifted = await store.lift(Scope.RUNTIME, blocked.name, "admin")
            await client.delete(generation.KEY)
            await keeper.check()
            assert not (await store.get(blocked.key) or lifted).blocked
        finally:
            await vault.aclose()
            await client.aclose()

    asyncio.run(scenario())


def test_upgrade_restores_the_hash_under_its_old_name(bootstrapped_vault: Any, redis_url: str) -> None:
    """A deployment from before the ``{vk:rev}`` slot: no marker under the new name, so the first
    new broker takes the data-loss path; records only the old hash held (a gateway's auto-revoke
    not yet copied to Vault) come back too, never over a record the new hash has, and a field of
    no scope stays behind."""

    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        vault = VaultClient(bootstrapped_vault.addr, Secret(bootstrapped_vault.broker_token))
        keeper = RevocationKeeper(client, vault)
        store = RevocationStore(client, require_generation=True)
        try:
            await client.flushall()
            only_old = new_revocation(Scope.RUN, f"run-{time.time_ns()}", "gateway", "alert")
            newer = new_revocation(Scope.UPSTREAM, f"up-{time.time_ns()}", "admin", "new")
            await client.hset(keys.LEGACY_REVOCATIONS, mapping={
                only_old.key: only_old.to_json(), newer.key: "{stale}", "bogus": "x"})
            await client.hset(HASH, newer.key, newer.to_json())
            await keeper.check()
            assert await store.get(only_old.key) == only_old
            assert await store.get(newer.key) == newer
            assert not await client.hexists(HASH, "bogus")
            assert await generation.read(client) is not None
        finally:
            await vault.aclose()
            await client.aclose()

    asyncio.run(scenario())


HOSTILE_NAMES = [
    pytest.param("../../other/path", id="dot-segments"),
    pytest.param("a/b", id="slash"),
    pytest.param("\x1b[31mred\x00", id="control-characters"),
    pytest.param("\U0007f45dFG\u00b6.\u0090", id="astral-and-c1"),  # what the fuzzer sent (500 before)
    pytest.param("naïve ✓ #?%", id="unicode-and-url-syntax"),
    pytest.param("~" + "A" * 40, id="looks-encoded"),
    pytest.param("x" * 300, id="long"),
]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_any_revoked_name_is_saved_and_restored(bootstrapped_vault: Any, redis_url: str, name: str) -> None:
    """A revoked name is what an admin typed: it reaches no other KV path, fails nothing, and
    comes back from Vault into an emptied Redis unchanged."""
    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        vault = VaultClient(bootstrapped_vault.addr, Secret(bootstrapped_vault.broker_token))
        keeper = RevocationKeeper(client, vault)
        try:
            await client.flushall()
            await keeper.check()
            record = new_revocation(Scope.RUN, name, "admin", "hostile name")
            await RevocationStore(client).put(record)
            await keeper.save(record)
            assert field_of(entry(record.key)) == record.key
            assert await vault.kv_get(MOUNT, f"{PREFIX}/{entry(record.key)}") is not None
            await client.flushall()
            await keeper.check()
            restored = await client.hget(HASH, record.key)
            assert restored is not None
        finally:
            await vault.kv_delete(MOUNT, f"{PREFIX}/{entry(record.key)}")
            await client.aclose()
            await vault.aclose()

    asyncio.run(scenario())
