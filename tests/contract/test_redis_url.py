"""contract/redis_url.py: which URLs are taken, and a Sentinel client that follows a failover."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from redis.exceptions import RedisError

from contract import redis_url
from contract.env import SettingsError, redis_url_setting
from valetkey.dev.sentinel import SentinelTopology


@pytest.mark.parametrize(("url", "problem"), [
    pytest.param("redis://127.0.0.1:6379/0", "", id="plain"),
    pytest.param("rediss://:pw@redis.internal:6380/1", "", id="tls"),
    pytest.param("unix:///run/redis.sock?db=2", "", id="unix"),
    pytest.param("redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/valetkey", "", id="sentinel"),
    pytest.param("redis+sentinel://:pw@s1:26379/valetkey/3?sentinel_password=x", "", id="sentinel-db-pw"),
    pytest.param("rediss+sentinel://s1:26379/valetkey", "", id="sentinel-tls"),
    pytest.param("redis+sentinel://s1:26379", "name the service", id="sentinel-no-service"),
    pytest.param("redis+sentinel://s1/valetkey", "host:port", id="sentinel-no-port"),
    pytest.param("redis+sentinel://s1:26379/valetkey/x", "is a number", id="sentinel-bad-db"),
    pytest.param("redis+sentinel://s1:26379/valetkey?foo=1", "unknown option", id="sentinel-option"),
    pytest.param("redis+cluster://c1:7000", "", id="cluster"),
    pytest.param("redis+cluster://:pw@c1:7000,c2:7000,[::1]:7000/0", "", id="cluster-seeds-pw"),
    pytest.param("rediss+cluster://c1:7000/", "", id="cluster-tls"),
    pytest.param("redis+cluster://c1:7000/2", "only database 0", id="cluster-db"),
    pytest.param("redis+cluster://c1", "host:port", id="cluster-no-port"),
    pytest.param("redis+cluster://:pw@c1:7000,c2", "host:port", id="cluster-seed-no-port"),
    pytest.param("redis+cluster://c1:7000?foo=1", "no options", id="cluster-option"),
    pytest.param("http://127.0.0.1:6379", "not a Redis URL", id="http"),
    pytest.param("127.0.0.1:6379", "not a Redis URL", id="no-scheme"),
    pytest.param("redis://", "no host", id="no-host"),
])
def test_urls(url: str, problem: str) -> None:
    if not problem:
        assert redis_url.check(url) == url
        return
    with pytest.raises(redis_url.RedisUrlError, match=problem) as caught:
        redis_url.check(url)
    assert "pw" not in str(caught.value)


def test_setting_names_its_key_never_the_password() -> None:
    with pytest.raises(SettingsError, match="VALETKEY_REDIS_URL") as caught:
        redis_url_setting({"VALETKEY_REDIS_URL": "redis+sentinel://:hunter2@s1/x"}, "VALETKEY_REDIS_URL", "")
    assert "hunter2" not in str(caught.value)
    target = redis_url.sentinel_target("redis+sentinel://:hunter2@s1:1/x")
    assert "hunter2" not in repr(target)
    seeds = redis_url.cluster_target("redis+cluster://:hunter2@c1:1,c2:2")
    assert seeds.seeds == (("c1", 1), ("c2", 2))
    assert seeds.password == "hunter2"
    assert "hunter2" not in repr(seeds)


@pytest.fixture(scope="module")
def sentinel() -> Iterator[SentinelTopology]:
    with SentinelTopology() as topology:
        yield topology


@pytest.mark.slow
def test_sentinel_client_follows_failover(sentinel: SentinelTopology) -> None:
    """One client, never rebuilt: works, fails (never hangs) while no primary answers, then works
    against the promoted replica, pub/sub included."""

    async def scenario() -> dict[str, float]:
        client = redis_url.async_client(sentinel.url, max_connections=8, pool_timeout=1.0,
                                        socket_timeout=1.0, socket_connect_timeout=1.0)
        try:
            await client.set("k", "before")
            sync = redis_url.sync_client(sentinel.url)
            assert sync.get("k") == b"before"
            sync.close()
            await client.execute_command("WAIT", 1, 2000)
            old = sentinel.kill_primary()
            killed = time.monotonic()
            failures = 0
            while True:
                try:
                    await asyncio.wait_for(client.set("k", "after"), 3.0)
                    break
                except RedisError:
                    failures += 1
                    await asyncio.sleep(0.1)
                assert time.monotonic() - killed < 30, "no promotion within 30 s"
            resumed = time.monotonic() - killed
            assert sentinel.primary_port() not in (None, old)
            assert await client.get("k") == b"after"
            pubsub = client.pubsub()
            await pubsub.subscribe("c")
            await client.publish("c", "hello")
            got = None
            for _ in range(20):
                got = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
                if got:
                    break
            await pubsub.aclose()  # type: ignore[no-untyped-call]
            assert got is not None
            assert got["data"] == b"hello"
            sentinel.restart(old)  # back as a replica of the new primary
            return {"resumed_s": resumed, "failed_calls": failures}
        finally:
            await client.aclose()

    figures = asyncio.run(scenario())
    assert figures["failed_calls"] >= 1
    print(f"sentinel failover: resumed after {figures['resumed_s']:.1f}s, "
          f"{figures['failed_calls']:.0f} calls failed meanwhile")
