"""Token verification against hostile tokens, some signed for real by the broker's transit key."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from contract.claims import b64url
from contract.errors import TokenInvalid
from contract.secret import Secret
from contract.vault import VaultClient
from tests.support.broker_stack import ISSUER, Broker

SLACK = {"upstream": "slack", "purpose": "post_message"}
Mutation = Callable[[dict[str, Any], dict[str, Any]], None]


def _b64json(value: Any) -> str:
    return b64url(json.dumps(value, separators=(",", ":")).encode())


async def _sign(broker: Broker, head: str, body: str) -> str:
    vault = VaultClient(broker.vault.addr, Secret(broker.vault.broker_token))
    try:
        key = await vault.transit_key("transit", "valetkey-tokens")
        [sig] = await vault.transit_sign("transit", "valetkey-tokens", [f"{head}.{body}".encode()],
                                         key.latest_version)
    finally:
        await vault.aclose()
    return f"{head}.{body}.{b64url(sig)}"


async def _fresh(broker: Broker) -> tuple[dict[str, Any], dict[str, Any], str]:
    """A genuine token's header and claims, to mutate and re-sign."""
    token = broker.mint("notifier", [SLACK]).json()["env"]["SLACK_BOT_TOKEN"]
    head, body, _ = token.split(".")
    pad: Callable[[str], bytes] = lambda s: base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))  # noqa: E731
    return json.loads(pad(head)), json.loads(pad(body)), token


def _set(section: str, key: str, value: Any) -> Mutation:
    def mutate(header: dict[str, Any], claims: dict[str, Any]) -> None:
        (header if section == "header" else claims)[key] = value
    return mutate


def _drop(key: str) -> Mutation:
    return lambda header, claims: claims.pop(key)


def _shift(key: str, seconds: int) -> Mutation:
    def mutate(header: dict[str, Any], claims: dict[str, Any]) -> None:
        claims[key] = int(time.time()) + seconds
    return mutate


SIGNED_MUTATIONS = [
    pytest.param(_set("header", "typ", "JWT"), "invalid_token", "typ", id="wrong-typ"),
    pytest.param(_set("header", "typ", "AT+JWT"), "invalid_token", "typ", id="typ-case"),
    pytest.param(lambda header, claims: header.pop("typ"), "invalid_token", "typ", id="no-typ"),
    pytest.param(_set("header", "crit", ["exp"]), "invalid_token", "header", id="crit-header"),
    pytest.param(_set("header", "jku", "http://evil/jwks"), "invalid_token", "header", id="jku-header"),
    pytest.param(_set("header", "b64", False), "invalid_token", "header", id="b64-header"),
    pytest.param(_set("header", "cty", "JWT"), "invalid_token", "header", id="unknown-header-member"),
    pytest.param(_set("header", "kid", "valetkey-tokens:v99"), "invalid_token", "kid", id="unknown-kid"),
    pytest.param(_set("claims", "iss", "http://evil"), "invalid_token", "iss", id="wrong-iss"),
    pytest.param(_set("claims", "aud", "github"), "audience_mismatch", "aud", id="other-audience"),
    pytest.param(_set("claims", "aud", ["slack", "github"]), "invalid_token", "aud", id="aud-list"),
    pytest.param(_set("claims", "aud", ["slack"]), "invalid_token", "aud", id="aud-single-list"),
    pytest.param(_shift("exp", -120), "invalid_token", "exp", id="expired"),
    pytest.param(_shift("nbf", 600), "invalid_token", "nbf", id="not-yet-valid"),
    pytest.param(_shift("iat", 600), "invalid_token", "iat", id="issued-in-future"),
    pytest.param(_shift("exp", 3 * 86400), "invalid_token", "exp", id="lifetime-too-long"),
    pytest.param(_set("claims", "exp", "9999999999"), "invalid_token", "exp", id="exp-string"),
    pytest.param(_set("claims", "exp", True), "invalid_token", "exp", id="exp-bool"),
    *[pytest.param(_drop(c), "invalid_token", c, id=f"missing-{c}")
      for c in ("iss", "sub", "aud", "exp", "nbf", "iat", "jti", "client_id", "grants")],
    pytest.param(_set("claims", "jti", ""), "invalid_token", "jti", id="empty-jti"),
    pytest.param(_set("claims", "grants", []), "invalid_token", "grants", id="no-grants"),
    pytest.param(_set("claims", "grants", [{"purpose": "x"}]), "invalid_token", "grants", id="bad-grant"),
    pytest.param(_set("claims", "sub", "run_forged"), "invalid_token", "run", id="unknown-run"),
    pytest.param(_set("claims", "client_id", "coding-agent"), "invalid_token", "run", id="other-runtime"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("mutate", "code", "check"), SIGNED_MUTATIONS)
async def test_signed_but_invalid_tokens(broker: Broker, mutate: Mutation, code: str, check: str) -> None:
    header, claims, _ = await _fresh(broker)
    mutate(header, claims)
    token = await _sign(broker, _b64json(header), _b64json(claims))
    async with broker.verifier("slack") as verifier:
        with pytest.raises(TokenInvalid) as info:
            await verifier.verify(token)
    assert (info.value.code, info.value.check) == (code, check)
    assert token not in str(info.value)
    assert token not in repr(info.value)


async def _unsigned(broker: Broker, kind: str) -> str:
    header, claims, genuine = await _fresh(broker)
    head, body, sig = genuine.split(".")
    if kind == "alg-none":
        return f"{_b64json({**header, 'alg': 'none'})}.{body}."
    if kind == "alg-none-with-sig":
        return f"{_b64json({**header, 'alg': 'none'})}.{body}.{sig}"
    if kind == "hs256-public-key":
        with broker.client() as client:
            jwk = client.get("/.well-known/jwks.json").json()["keys"][0]
        new_head = _b64json({**header, "alg": "HS256"})
        public_key = base64.urlsafe_b64decode(jwk["x"] + "==")
        mac = hmac.new(public_key, f"{new_head}.{body}".encode(), hashlib.sha256).digest()
        return f"{new_head}.{body}.{b64url(mac)}"
    if kind == "tampered-payload":
        return f"{head}.{_b64json({**claims, 'grants': [{'purpose': 'admin', 'params': {}}]})}.{sig}"
    if kind == "tampered-signature":
        return f"{head}.{body}.{sig[:-4]}AAAA"
    if kind == "duplicate-claim":
        raw = json.dumps(claims, separators=(",", ":"))[:-1] + ',"aud":"github"}'
        return await _sign(broker, head, b64url(raw.encode()))
    if kind == "duplicate-header":
        raw = json.dumps(header, separators=(",", ":"))[:-1] + ',"alg":"none"}'
        return await _sign(broker, b64url(raw.encode()), body)
    if kind == "oversized":
        return await _sign(broker, head, _b64json({**claims, "pad": "x" * 5000}))
    if kind == "two-segments":
        return f"{head}.{body}"
    if kind == "padding-chars":
        return f"{head}=.{body}.{sig}"
    if kind == "not-json-header":
        return f"{b64url(b'not json')}.{body}.{sig}"
    if kind == "array-payload":
        return await _sign(broker, head, b64url(b"[1,2]"))
    if kind == "empty":
        return ""
    raise AssertionError(kind)


UNSIGNED = [
    pytest.param("alg-none", "format", id="alg-none-empty-signature"),
    pytest.param("alg-none-with-sig", "alg", id="alg-none-with-signature"),
    pytest.param("hs256-public-key", "alg", id="hs256-keyed-with-public-key"),
    pytest.param("tampered-payload", "signature", id="tampered-payload"),
    pytest.param("tampered-signature", "signature", id="tampered-signature"),
    pytest.param("duplicate-claim", "json", id="duplicate-claim-names"),
    pytest.param("duplicate-header", "json", id="duplicate-header-names"),
    pytest.param("oversized", "size", id="oversized"),
    pytest.param("two-segments", "format", id="two-segments"),
    pytest.param("padding-chars", "format", id="padding-characters"),
    pytest.param("not-json-header", "json", id="header-not-json"),
    pytest.param("array-payload", "json", id="payload-not-object"),
    pytest.param("empty", "format", id="empty"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("kind", "check"), UNSIGNED)
async def test_forged_tokens(broker: Broker, kind: str, check: str) -> None:
    token = await _unsigned(broker, kind)
    async with broker.verifier("slack") as verifier:
        with pytest.raises(TokenInvalid) as info:
            await verifier.verify(token)
    assert (info.value.code, info.value.check) == ("invalid_token", check)


@pytest.mark.anyio
async def test_leeway_and_injectable_clock(broker: Broker) -> None:
    _, claims, token = await _fresh(broker)
    async with broker.verifier("slack", now=lambda: claims["exp"] + 3) as within_leeway:
        await within_leeway.verify(token)
    async with broker.verifier("slack", now=lambda: claims["exp"] + 6) as past_leeway:
        with pytest.raises(TokenInvalid) as info:
            await past_leeway.verify(token)
    assert info.value.check == "exp"
    async with broker.verifier("slack", now=lambda: claims["nbf"] - 3) as early:
        await early.verify(token)


@pytest.mark.anyio
async def test_repeated_token_costs_no_fetch(broker: Broker) -> None:
    _, _, token = await _fresh(broker)
    async with broker.verifier("slack") as verifier:
        for _ in range(50):
            await verifier.verify(token)
        assert verifier.keys.fetches == 1


@pytest.mark.anyio
async def test_unknown_kid_refresh_is_rate_limited(broker: Broker) -> None:
    header, claims, token = await _fresh(broker)
    forged = [await _sign(broker, _b64json({**header, "kid": f"valetkey-tokens:v{n}"}), _b64json(claims))
              for n in range(90, 95)]
    async with broker.verifier("slack", min_refresh_interval=60) as verifier:
        await verifier.verify(token)
        for bad in forged:
            with pytest.raises(TokenInvalid):
                await verifier.verify(bad)
        assert verifier.keys.fetches == 1


def test_issuer_constant_matches_settings(broker: Broker) -> None:
    assert broker.settings.issuer == ISSUER
