"""A revocation issued while Redis is down: the API says it was not recorded, the CLI retries until
it is (Redis stopped, then started while the CLI waits)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from broker.app import create_app
from contract.revocations import HASH
from tests.support.broker_stack import broker_settings
from tests.support.servers import ThreadedServer
from valetkey.dev.services import RedisServer

VALETKEY = str(Path(sys.executable).parent / "valetkey")


@pytest.fixture
def broker_without_redis(bootstrapped_vault: Any) -> Iterator[tuple[str, RedisServer]]:
    """A broker on a Redis of its own, which the test stops and starts."""
    with RedisServer() as store, ThreadedServer(create_app(broker_settings(bootstrapped_vault, store.url))) as srv:
        store.stop()
        yield srv.url, store


@pytest.mark.parametrize(("method", "path", "body"), [
    pytest.param("POST", "/v1/revocations", {"scope": "runtime", "name": "notifier"}, id="revoke"),
    pytest.param("DELETE", "/v1/revocations/runtime/notifier", None, id="lift"),
])
def test_the_api_says_nothing_was_recorded(bootstrapped_vault: Any,
                                           broker_without_redis: tuple[str, RedisServer],
                                           method: str, path: str, body: Any) -> None:
    url, _ = broker_without_redis
    response = httpx.request(method, f"{url}{path}", json=body, timeout=10,
                             headers={"X-Vault-Token": bootstrapped_vault.admin_token})
    answer = response.json()
    assert (response.status_code, answer["error"], answer["recorded"]) == (503, "redis_unavailable", False)
    assert "NOT recorded" in answer["detail"]


def test_the_cli_retries_until_the_revocation_is_recorded(
    bootstrapped_vault: Any, broker_without_redis: tuple[str, RedisServer]
) -> None:
    url, store = broker_without_redis
    env = {**os.environ, "VAULT_TOKEN": bootstrapped_vault.admin_token, "VALETKEY_BROKER_URL": url}
    cli = subprocess.Popen([VALETKEY, "revoke", "--runtime", "notifier", "--reason", "drill"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert cli.stderr is not None
    try:
        first = cli.stderr.readline()  # blocks until the first refused attempt is reported
        assert "NOT recorded yet (503 redis_unavailable" in first, first
        time.sleep(1.5)  # and a retry or two more while Redis is still down
        assert cli.poll() is None, "the CLI gave up while Redis was down"
        store.start()
        out, err = cli.communicate(timeout=30)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.communicate()
    assert cli.returncode == 0, first + err
    assert out.startswith("revoked runtime notifier at ")
    with redis.Redis.from_url(store.url) as client:
        record = json.loads(client.hget(HASH, "runtime:notifier") or "{}")
    assert (record["blocked"], record["why"]) == (True, "drill")
    # lifted through the broker: its durable copy in the shared Vault (broker/revocation_keeper.py)
    # would otherwise block runtime notifier for every later broker on this Vault
    httpx.delete(f"{url}/v1/revocations/runtime/notifier", timeout=10,
                 headers={"X-Vault-Token": bootstrapped_vault.admin_token}).raise_for_status()
