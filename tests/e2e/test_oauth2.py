"""OAuth2 sources end to end: the openai SDK through gateways whose credential is an access token
from the demo OAuth provider (authlib's server side: real expiry, refresh-token rotation), with
access tokens living 10 seconds, so the run sees several refreshes; the SDK's key (the placeholder)
never changes and no request fails. The delegated grant's rotated refresh token is written back to
Vault. An access token the provider stops honouring early is refreshed once and the idempotent
request retried.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
import yaml
from starlette.datastructures import Headers

from contract.secret import Secret
from gateways.gateway import Gateway
from gateways.sources.base import IssuedCredential
from gateways.sources.issued import IssuedValues
from tests.e2e.conftest import run_client, sandbox_env
from tests.support.servers import ThreadedServer
from tests.support.source_stack import SourceStack, runtime_yaml, source_stack, wait_for
from valetkey.bootstrap import open_client
from valetkey.dev.demo.common import bearer_token
from valetkey.dev.demo.oauth_provider import TOKEN_PATH, OAuthProvider
from valetkey.dev.demo.openai_like import OpenAILike
from valetkey.dev.services import RedisServer

CLIENT = Path(__file__).parent / "clients" / "openai_refresh.py"
LIFETIME = 10  # seconds an access token lives: refreshed 5 s ahead (a new value's forms build in
# tens of ms, docs/benchmarks.md#run-scoped-credentials; the margin is for a loaded 2-core box)
CLIENT_PATH, GRANT_PATH = "valetkey/oauth/demo", "valetkey/oauth/demo-grant"


class OAuthOpenAI(OpenAILike):
    """The demo OpenAI API as a resource server: it accepts the provider's live access tokens."""

    provider: OAuthProvider

    def authorized(self, headers: Headers) -> bool:
        return self.provider.valid(bearer_token(headers))


PURPOSES = {
    "chat": {"why": "Chat.", "methods": ["POST"], "paths": ["/v1/chat/completions"]},
    "list_models": {"why": "List models.", "methods": ["GET"], "paths": ["/v1/models"]},
}


def write_policies(directory: Path, api_port: int, token_url: str) -> None:
    sources = {
        "oaicc": {"kind": "oauth2", "token_url": token_url, "grant": "client_credentials",
                  "client": {"path": CLIENT_PATH}, "scope": "read"},
        "oairt": {"kind": "oauth2", "token_url": token_url, "grant": "refresh_token",
                  "client": {"path": CLIENT_PATH},
                  "refresh_token": {"path": GRANT_PATH, "field": "refresh_token"}},
    }
    for name, source in sources.items():
        doc = {"version": 1, "kind": "upstream", "name": name, "base_url": f"http://127.0.0.1:{api_port}",
               "allow_private": True, "source": source,
               "inject": {"header": "Authorization", "format": "Bearer {secret}"},
               "env": {"placeholder": f"{name.upper()}_TOKEN", "base_url": f"{name.upper()}_URL"},
               "purposes": PURPOSES}
        (directory / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (directory / "tester.yaml").write_text(runtime_yaml({n: list(PURPOSES) for n in sources}))


class Demo:
    def __init__(self, stack: SourceStack, provider: OAuthProvider, api: OAuthOpenAI) -> None:
        self.stack, self.provider, self.api = stack, provider, api

    def kv_refresh_token(self) -> str:
        with open_client(self.stack.vault.addr, self.stack.vault.root_token) as client:
            data = client.secrets.kv.v2.read_secret_version(path=GRANT_PATH, mount_point="secret",
                                                            raise_on_deleted_version=True)
        return str(data["data"]["data"]["refresh_token"])


@pytest.fixture(scope="module")
def demo(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    work = tmp_path_factory.mktemp("oauth2")
    provider = OAuthProvider(expires_in=LIFETIME)
    provider.register("valetkey-demo", "demo-client-secret")
    grant = provider.delegate("valetkey-demo", "alice")
    api = OAuthOpenAI("")
    api.provider = provider
    provider_server, api_server = ThreadedServer(provider).start(), ThreadedServer(api).start()
    write_policies(work, api_server.port, f"{provider_server.url}{TOKEN_PATH}")

    def prepare(vault: Any) -> None:
        with open_client(vault.addr, vault.root_token) as client:
            client.secrets.kv.v2.create_or_update_secret(path=CLIENT_PATH, mount_point="secret", secret={
                "client_id": "valetkey-demo", "client_secret": "demo-client-secret"})
            client.secrets.kv.v2.create_or_update_secret(path=GRANT_PATH, mount_point="secret",
                                                          secret={"refresh_token": grant, "user": "alice"})

    try:
        with source_stack(work, redis_server, prepare) as stack:
            yield Demo(stack, provider, api)
    finally:
        provider_server.stop()
        api_server.stop()


def _run_sdk(demo: Demo, upstream: str, tmp_path: Path, seconds: float) -> tuple[dict[str, Any], str]:
    bundle = demo.stack.mint([{"upstream": upstream, "purpose": p, "params": {}} for p in PURPOSES])
    env = sandbox_env(bundle, tmp_path / "home", PREFIX=upstream.upper(), SECONDS=str(seconds))
    ran = run_client([sys.executable, str(CLIENT)], env)
    assert ran.returncode == 0, ran.stderr[-2000:]
    return json.loads(ran.stdout), bundle["env"][f"{upstream.upper()}_TOKEN"]


@pytest.mark.slow
@pytest.mark.parametrize("upstream", ["oairt"])  # the delegated grant: refresh-token rotation too
def test_openai_sdk_across_refreshes(demo: Demo, upstream: str, tmp_path: Path) -> None:
    issued, rotations = demo.provider.issued, demo.provider.rotations
    result, placeholder = _run_sdk(demo, upstream, tmp_path, seconds=LIFETIME * 2.2)
    assert result["failed"] == []
    assert result["ok"] >= 10
    assert result["key"] == placeholder  # the sandbox's key never changed
    # issued once, then refreshed ahead of expiry at least twice while the SDK ran
    assert demo.provider.issued - issued >= 3
    if upstream == "oairt":
        assert demo.provider.rotations - rotations >= 2
        live = [t for t in demo.provider.refresh_tokens.values() if not t.revoked and t.user == "alice"]
        wait_for(lambda: demo.kv_refresh_token() in {t.refresh_token for t in live})


@pytest.mark.slow  # waits for the next refresh (up to half a 10 s token, plus its forms)
def test_expired_early_is_refreshed_once_and_retried(demo: Demo) -> None:
    stack = demo.stack
    bundle = stack.mint([{"upstream": "oaicc", "purpose": "list_models", "params": {}}])
    headers = {"authorization": f"Bearer {bundle['env']['OAICC_TOKEN']}"}
    url = f"{stack.url('oaicc')}/v1/models"
    assert httpx.get(url, headers=headers, timeout=10).status_code == 200
    gateway = stack.app("oaicc").gateway
    assert gateway is not None
    assert gateway.credentials is not None
    credentials = gateway.credentials
    # tokens living a minute from the next refresh on, so no background refresh races the test
    demo.provider.expires_in = 60
    wait_for(lambda: credentials.held(bundle["run_id"]) is not None and
             credentials.held(bundle["run_id"]).credential.remaining() > 30,  # type: ignore[union-attr]
             timeout=30)
    held = credentials.held(bundle["run_id"])
    assert held is not None
    demo.provider.access_tokens[held.credential.value.reveal()].expires_at = 0  # refused early
    response = httpx.get(url, headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    now_held = credentials.held(bundle["run_id"])
    assert now_held is not None
    assert now_held.credential.value != held.credential.value
    lines = stack.audit(bundle["run_id"])
    assert {line["credential_kind"] for line in lines} == {"oauth2_access_token"}


def test_a_refused_post_is_not_sent_again_but_the_next_request_works(demo: Demo) -> None:
    stack = demo.stack
    demo.provider.expires_in = 60
    bundle = stack.mint([{"upstream": "oaicc", "purpose": "chat", "params": {}}])
    headers = {"authorization": f"Bearer {bundle['env']['OAICC_TOKEN']}"}
    url = f"{stack.url('oaicc')}/v1/chat/completions"
    body = {"model": "gpt-demo", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(url, headers=headers, json=body, timeout=10).status_code == 200
    gateway = stack.app("oaicc").gateway
    assert gateway is not None
    assert gateway.credentials is not None
    credentials = gateway.credentials
    wait_for(lambda: credentials.held(bundle["run_id"]) is not None and
             credentials.held(bundle["run_id"]).credential.remaining() > 30,  # type: ignore[union-attr]
             timeout=30)
    held = credentials.held(bundle["run_id"])
    assert held is not None
    posts = sum(1 for s in demo.api.seen if s.method == "POST")
    demo.provider.access_tokens[held.credential.value.reveal()].expires_at = 0
    refused = httpx.post(url, headers=headers, json=body, timeout=10)
    assert refused.status_code == 401  # the upstream's answer, passed on: a POST is never sent twice
    assert sum(1 for s in demo.api.seen if s.method == "POST") == posts + 1
    wait_for(lambda: credentials.held(bundle["run_id"]) is not held)
    assert httpx.post(url, headers=headers, json=body, timeout=10).status_code == 200


def _publish(redis_url: str, value: str, *, revoke: bool = False) -> None:
    """What the Postgres gateway's lease cache does when Vault issues (or it revokes) a password."""

    async def publish() -> None:
        client = aioredis.from_url(redis_url)
        issued = IssuedValues(client)
        credential = IssuedCredential(Secret(value), "database_password", "database/creds/ro/x",
                                      time.time() + 300)
        issued.add(credential)
        if revoke:
            issued.discard(credential)
        await issued.stop()
        await client.aclose()

    asyncio.run(publish())


def _refused(gateway: Gateway, value: str) -> bool:
    return gateway.scanner().find(value.encode()) is not None


def _send(stack: SourceStack, upstream: str, where: str, value: str) -> tuple[httpx.Response, str]:
    bundle = stack.mint([{"upstream": upstream, "purpose": p, "params": {}} for p in PURPOSES])
    headers = {"authorization": f"Bearer {bundle['env'][f'{upstream.upper()}_TOKEN']}"}
    base, run = stack.url(upstream), bundle["run_id"]
    if where == "header":
        return httpx.get(f"{base}/v1/models", headers={**headers, "x-note": value}, timeout=10), run
    if where == "query":
        return httpx.get(f"{base}/v1/models", params={"q": value}, headers=headers, timeout=10), run
    body = {"model": "gpt-demo", "messages": [{"role": "user", "content": f"use {value} please"}]}
    return httpx.post(f"{base}/v1/chat/completions", headers=headers, json=body, timeout=10), run


@pytest.mark.parametrize(("whose", "sent_to", "where"), [
    pytest.param("oaicc", "oaicc", "header", id="own-token-in-a-header"),
    pytest.param("oaicc", "oaicc", "query", id="own-token-in-the-query"),
    pytest.param("oaicc", "oaicc", "json", id="own-token-in-a-json-body"),
    pytest.param("oaicc", "oairt", "header", id="another-gateways-token"),
    pytest.param("oairt", "oaicc", "json", id="another-gateways-token-in-json"),
    pytest.param("database", "oaicc", "query", id="a-database-password"),
    pytest.param("database", "oairt", "json", id="a-database-password-in-json"),
])
def test_an_issued_credential_sent_back_is_passthrough(demo: Demo, whose: str, sent_to: str,
                                                       where: str) -> None:
    """Refused 403 credential_passthrough (pattern issued_credential) at the gateway that issued
    it (its values), at another (the digests every replica publishes), and for a database
    password the Postgres gateway published; a revoked one is forgotten."""
    stack = demo.stack
    receiver = stack.app(sent_to).gateway
    assert receiver is not None
    if whose == "database":
        value = "A1a-" + secrets.token_urlsafe(16)  # Vault's default password shape
        _publish(stack.redis_url, value)
    else:
        demo.provider.expires_in = 60
        bundle = stack.mint([{"upstream": whose, "purpose": "list_models", "params": {}}])
        headers = {"authorization": f"Bearer {bundle['env'][f'{whose.upper()}_TOKEN']}"}
        assert httpx.get(f"{stack.url(whose)}/v1/models", headers=headers, timeout=10).status_code == 200
        issuer = stack.app(whose).gateway
        assert issuer is not None
        assert issuer.credentials is not None
        held = issuer.credentials.held(bundle["run_id"])
        assert held is not None
        value = held.credential.value.reveal()
    wait_for(lambda: _refused(receiver, value), timeout=5)  # another replica: within one tick
    response, run = _send(stack, sent_to, where, value)
    assert (response.status_code, response.json()["error"]) == (403, "credential_passthrough")
    assert value not in response.text
    lines = stack.audit(run)
    assert [line["reason"] for line in lines] == ["credential_passthrough"]
    assert value not in json.dumps(lines)
    if whose == "database":
        _publish(stack.redis_url, value, revoke=True)
        wait_for(lambda: not _refused(receiver, value), timeout=5)
