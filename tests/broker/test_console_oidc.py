"""Console sign-in through OpenID Connect, against a real provider built on authlib's server side.

The provider (``valetkey/dev/demo/oidc_provider.py``) runs the authorization code flow with PKCE and
a nonce and signs ID tokens with a key it publishes; the broker's console exchanges the code and
verifies the ID token (joserfc) before it makes the same server-side session a Vault token gives.
Users: alice (security team), bob (release managers: the ``releases`` approver group), mallory (in
no group the console knows).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import httpx
import hvac
import pytest
import redis.asyncio as aioredis
from joserfc import jwt
from joserfc.jwk import OctKey, RSAKey
from playwright.sync_api import Page

from broker.app import create_app
from broker.oidc_client import OIDCClient
from broker.oidc_settings import OIDCSettings
from broker.settings import BrokerSettings
from contract.env import SettingsError
from contract.errors import TokenInvalid
from contract.secret import Secret
from contract.vault import VaultClient
from tests.broker.test_console_browser import browser, page  # noqa: F401 - fixtures
from tests.support.gateway_stack import ISSUER, Stack
from tests.support.servers import ThreadedServer
from valetkey.dev.demo.oidc_provider import OIDCProvider
from valetkey.dev.services import free_port

T = TypeVar("T")
CLIENT_ID, CLIENT_SECRET = "valetkey-console", "console-secret-for-tests"


@dataclass
class Setup:
    broker: str
    provider: OIDCProvider
    settings: OIDCSettings


@pytest.fixture(scope="module")
def oidc(gateway_stack: Stack) -> Iterator[Setup]:
    provider = OIDCProvider(users={"alice": ("security",), "bob": ("release-managers",),
                                   "mallory": ("marketing",)})
    with ThreadedServer(provider) as idp:
        provider.issuer = idp.url
        port = free_port()
        broker_url = f"http://127.0.0.1:{port}"
        provider.register(CLIENT_ID, CLIENT_SECRET, f"{broker_url}/console/oidc/callback")
        env = {"VAULT_ADDR": gateway_stack.vault.addr, "VAULT_TOKEN": gateway_stack.vault.broker_token,
               "VALETKEY_REDIS_URL": gateway_stack.redis_url, "VALETKEY_ISSUER": ISSUER,
               "VALETKEY_CONSOLE_INSECURE_COOKIES": "1",
               "VALETKEY_CONSOLE_OIDC_ISSUER": idp.url, "VALETKEY_CONSOLE_OIDC_CLIENT_ID": CLIENT_ID,
               "VALETKEY_CONSOLE_OIDC_CLIENT_SECRET": CLIENT_SECRET,
               "VALETKEY_CONSOLE_OIDC_REDIRECT_URL": f"{broker_url}/console/oidc/callback",
               "VALETKEY_CONSOLE_OIDC_ADMIN_GROUPS": "security",
               "VALETKEY_CONSOLE_OIDC_APPROVER_GROUPS": "release-managers=releases"}
        settings = BrokerSettings.from_env(env)
        assert settings.console_oidc is not None
        with ThreadedServer(create_app(settings, gateway_stack.policies), port=port):
            yield Setup(broker_url, provider, settings.console_oidc)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """On a thread of its own: Playwright's sync API keeps an event loop running on this one."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def sign_in_as(setup: Setup, user: str, client: httpx.Client) -> httpx.Response:
    """The flow without a browser: start, the provider's page answered, the callback."""
    start = client.get("/console/oidc/login")
    assert start.status_code == 303, start.text
    chosen = httpx.post(start.headers["location"], data={"user": user})
    assert chosen.status_code == 303, chosen.text
    return client.get(chosen.headers["location"])


@pytest.mark.parametrize(("user", "lands", "error"), [
    pytest.param("alice", "/console", "", id="security-team"),
    pytest.param("bob", "/console/approvals", "", id="approver-group"),
    pytest.param("mallory", "", "not_approver", id="no-known-group"),
])
def test_who_signs_in(oidc: Setup, user: str, lands: str, error: str) -> None:
    with httpx.Client(base_url=oidc.broker) as client:
        done = sign_in_as(oidc, user, client)
        if error:
            assert (done.status_code, done.headers["location"]) == (303, f"/console/login?error={error}")
            assert "valetkey_session" not in client.cookies
            return
        assert done.status_code == 200, done.text
        assert f'url={lands}"' in done.text
        cookie = done.headers["set-cookie"].lower()
        assert "httponly" in cookie
        assert "samesite=strict" in cookie
        page = client.get(lands)
    assert page.status_code == 200
    assert f"oidc:{user}" in page.text


def test_a_callback_from_another_browser_or_twice_is_refused(oidc: Setup) -> None:
    with httpx.Client(base_url=oidc.broker) as victim, httpx.Client(base_url=oidc.broker) as other:
        start = victim.get("/console/oidc/login")
        chosen = httpx.post(start.headers["location"], data={"user": "alice"})
        callback = chosen.headers["location"]
        foreign = other.get(callback)  # no state cookie: a link planted in someone else's browser
        assert foreign.headers["location"] == "/console/login?error=oidc_state_invalid"
        assert victim.get(callback).status_code == 200
        again = victim.get(callback)  # the state (and the code) are single use
    assert again.headers["location"] == "/console/login?error=oidc_state_invalid"


def _claims(oidc: Setup, **changes: Any) -> dict[str, Any]:
    now = int(time.time())
    base = {"iss": oidc.settings.issuer, "aud": CLIENT_ID, "sub": "alice", "iat": now, "exp": now + 300,
            "nonce": "n-1", "groups": ["security"]}
    return {k: v for k, v in {**base, **changes}.items() if v is not None}


OTHER_KEY = RSAKey.generate_key(2048, private=True)
TOKEN_CASES = [
    # (claim changes, key: provider | other | hmac | none, expected: None = accepted, else the check)
    pytest.param({}, "provider", None, id="valid"),
    pytest.param({"nonce": "n-other"}, "provider", "nonce", id="wrong-nonce"),
    pytest.param({"aud": "another-client"}, "provider", "aud", id="wrong-audience"),
    pytest.param({"iss": "https://evil.example"}, "provider", "iss", id="wrong-issuer"),
    pytest.param({"exp": int(time.time()) - 3600}, "provider", "exp", id="expired"),
    pytest.param({"nonce": None}, "provider", "nonce", id="no-nonce"),
    pytest.param({"aud": [CLIENT_ID, "x"], "azp": "x"}, "provider", "authorized party", id="other-azp"),
    pytest.param({}, "other", "signature", id="unknown-key"),
    pytest.param({}, "hmac", "signature", id="hs256-not-allowed"),
]


@pytest.mark.parametrize(("changes", "key", "fails_on"), TOKEN_CASES)
def test_id_token_verification(oidc: Setup, gateway_stack: Stack, changes: dict[str, Any], key: str,
                               fails_on: str | None) -> None:
    if key == "hmac":
        token = jwt.encode({"alg": "HS256", "kid": oidc.provider.kid}, _claims(oidc, **changes),
                           OctKey.import_key(b"k" * 32))
    else:
        signer = oidc.provider.key if key == "provider" else OTHER_KEY
        token = jwt.encode({"alg": "RS256", "kid": oidc.provider.kid}, _claims(oidc, **changes), signer)

    async def verify() -> dict[str, Any]:
        vault, store = VaultClient(gateway_stack.vault.addr, Secret("")), aioredis.Redis.from_url(gateway_stack.redis_url)
        client = OIDCClient(oidc.settings, vault, store)
        try:
            return await client.verify(token, "n-1")
        finally:
            await client.aclose()
            await vault.aclose()
            await store.aclose()

    if fails_on is None:
        assert run(verify())["sub"] == "alice"
        return
    with pytest.raises(TokenInvalid) as info:
        run(verify())
    assert info.value.code == "oidc_token_invalid"
    assert fails_on in info.value.detail


@pytest.mark.slow
def test_sign_in_through_the_provider_in_a_browser(oidc: Setup, page: Page, tmp_path: Path) -> None:  # noqa: F811
    shots = tmp_path / "screenshots"
    shots.mkdir()
    page.goto(f"{oidc.broker}/console/login")
    page.click("a.oidc")
    page.wait_for_url(f"{oidc.provider.issuer}/authorize**")
    page.screenshot(path=str(shots / "01-provider.png"), full_page=True)
    page.click("button[value=alice]")
    page.wait_for_url(f"{oidc.broker}/console")
    assert "oidc:alice" in page.content()
    page.screenshot(path=str(shots / "02-console-after-oidc.png"), full_page=True)
    cookies = {c["name"]: c for c in page.context.cookies()}
    assert cookies["valetkey_session"]["httpOnly"]
    assert cookies["valetkey_session"]["sameSite"] == "Strict"


def test_the_client_secret_can_come_from_vault(oidc: Setup, gateway_stack: Stack) -> None:
    root = gateway_stack.vault.root_token
    hvac.Client(url=gateway_stack.vault.addr, token=root).secrets.kv.v2.create_or_update_secret(
        path="valetkey/console/oidc", secret={"client_secret": "from-vault"}, mount_point="secret")
    settings = replace(oidc.settings, client_secret=Secret(""), secret_vault=("secret", "valetkey/console/oidc",
                                                                               "client_secret"))

    async def read() -> str:
        vault, store = VaultClient(gateway_stack.vault.addr, Secret(root)), aioredis.Redis.from_url(gateway_stack.redis_url)
        client = OIDCClient(settings, vault, store)
        try:
            return (await client._client_secret()).reveal()
        finally:
            await client.aclose()
            await vault.aclose()
            await store.aclose()

    assert run(read()) == "from-vault"


BASE_ENV = {"VALETKEY_CONSOLE_OIDC_ISSUER": "https://idp.example", "VALETKEY_CONSOLE_OIDC_CLIENT_ID": "c",
            "VALETKEY_CONSOLE_OIDC_CLIENT_SECRET": "s",
            "VALETKEY_CONSOLE_OIDC_REDIRECT_URL": "https://valetkey.example/console/oidc/callback",
            "VALETKEY_CONSOLE_OIDC_ADMIN_GROUPS": "security"}


@pytest.mark.parametrize(("changes", "message"), [
    pytest.param({"VALETKEY_CONSOLE_OIDC_ISSUER": "http://idp.example"}, "must be https", id="plain-http-issuer"),
    pytest.param({"VALETKEY_CONSOLE_OIDC_ADMIN_GROUPS": ""}, "must name a group", id="no-group"),
    pytest.param({"VALETKEY_CONSOLE_OIDC_CLIENT_SECRET_FILE": "/x"}, "exactly one of", id="two-secrets"),
    pytest.param({"VALETKEY_CONSOLE_OIDC_CLIENT_SECRET": "", "VALETKEY_CONSOLE_OIDC_CLIENT_SECRET_VAULT": "kv"},
                 "mount/path#field", id="bad-vault-ref"),
    pytest.param({"VALETKEY_CONSOLE_OIDC_APPROVER_GROUPS": "x"}, "provider-group=approver-group",
                 id="bad-approver-pair"),
    pytest.param({"VALETKEY_CONSOLE_OIDC_REDIRECT_URL": ""}, "REDIRECT_URL must be set", id="no-redirect"),
])
def test_bad_oidc_settings_name_their_key(changes: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as info:
        OIDCSettings.from_env({**BASE_ENV, **changes})
    assert message in str(info.value)
    assert "s" not in str(info.value).split()
