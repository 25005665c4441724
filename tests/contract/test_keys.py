"""Signing-key rotation and retirement through the real CLI against real OpenBao transit.

Runs against its own transit key so rotating does not disturb the other broker tests.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hvac
import pytest

from broker.app import create_app
from contract.errors import TokenInvalid
from tests.support.broker_stack import Broker, broker_settings
from tests.support.servers import ThreadedServer

KEY = "valetkey-rotation-test"
VALETKEY = str(Path(sys.executable).parent / "valetkey")
SLACK = {"upstream": "slack", "purpose": "post_message"}


@pytest.fixture(scope="module")
def rotating_broker(bootstrapped_vault: Any, redis_server: Any) -> Iterator[Broker]:
    client = hvac.Client(url=bootstrapped_vault.addr, token=bootstrapped_vault.root_token)
    client.secrets.transit.create_key(name=KEY, key_type="ed25519", mount_point="transit")
    policy = client.sys.read_policy("valetkey-broker")["data"]["rules"]
    client.sys.create_or_update_policy(
        "valetkey-broker",
        policy + f'\npath "transit/sign/{KEY}" {{ capabilities = ["update"] }}\n'
        f'path "transit/keys/{KEY}" {{ capabilities = ["read"] }}\n',
    )
    admin = client.sys.read_policy("valetkey-admin")["data"]["rules"]
    client.sys.create_or_update_policy(
        "valetkey-admin",
        admin + f'\npath "transit/keys/{KEY}*" {{ capabilities = ["read", "update"] }}\n',
    )
    settings = broker_settings(
        bootstrapped_vault, redis_server.url, VALETKEY_SIGNING_KEY=KEY, VALETKEY_KEY_CACHE_TTL="1s"
    )
    with ThreadedServer(create_app(settings)) as server:
        yield Broker(server.url, settings, bootstrapped_vault)
    client.adapter.close()


def keys_cli(vault: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.admin_token}
    return subprocess.run([VALETKEY, "keys", *args, "--key", KEY], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


def kid_of(token: str) -> str:
    head = token.split(".")[0]
    kid: str = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))["kid"]
    return kid


def jwks_kids(broker: Broker) -> list[str]:
    with broker.client() as client:
        return [k["kid"] for k in client.get("/.well-known/jwks.json").json()["keys"]]


@pytest.mark.anyio
async def test_rotate_then_retire(rotating_broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = rotating_broker
    old = broker.mint("notifier", [SLACK]).json()["env"]["SLACK_BOT_TOKEN"]
    assert kid_of(old) == f"{KEY}:v1"

    rotated = keys_cli(broker.vault, "rotate")
    assert rotated.returncode == 0, rotated.stderr
    assert "latest v2" in rotated.stdout
    # the broker caches key metadata for VALETKEY_KEY_CACHE_TTL (1s here)
    await _wait_for_kid(broker, f"{KEY}:v2")
    new = broker.mint("notifier", [SLACK]).json()["env"]["SLACK_BOT_TOKEN"]
    assert kid_of(new) == f"{KEY}:v2"
    assert set(jwks_kids(broker)) == {f"{KEY}:v1", f"{KEY}:v2"}

    async with broker.verifier("slack", min_refresh_interval=0) as verifier:
        await verifier.verify(old)  # older live version still verifies
        await verifier.verify(new)

        retired = keys_cli(broker.vault, "retire", "--below", "2")
        assert retired.returncode == 0, retired.stderr
        assert "live versions [2]" in retired.stdout
        await _wait_for_jwks(broker, [f"{KEY}:v2"])
        await verifier.keys.refresh(force=True)
        with pytest.raises(TokenInvalid) as info:
            await verifier.verify(old)
        assert info.value.check == "kid"
        await verifier.verify(new)


async def _wait_for_kid(broker: Broker, kid: str) -> None:
    import anyio

    for _ in range(150):
        token = broker.mint("notifier", [SLACK]).json()["env"]["SLACK_BOT_TOKEN"]
        if kid_of(token) == kid:
            return
        await anyio.sleep(0.1)
    raise AssertionError(f"broker never signed with {kid}")


async def _wait_for_jwks(broker: Broker, kids: list[str]) -> None:
    import anyio

    for _ in range(150):
        if jwks_kids(broker) == kids:
            return
        await anyio.sleep(0.1)
    raise AssertionError(f"JWKS never became {kids}")


def test_keys_cli_refuses_without_vault_env() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("VAULT_ADDR", "VAULT_TOKEN")}
    result = subprocess.run([VALETKEY, "keys", "rotate"], env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 1
    assert "VAULT_ADDR" in result.stderr
