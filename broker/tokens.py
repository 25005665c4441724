"""The run token contract (RFC 9068 style access tokens) and minting through Vault transit.

A token is a compact JWS: header ``{"alg": "Ed25519", "typ": "at+jwt", "kid": "<key>:v<n>"}``,
claims ``iss, sub (run id), aud (one gateway), exp, nbf, iat, jti, client_id (runtime),
grants [{purpose, params}]``. The private key never leaves Vault: we build the signing input,
transit signs it, and we assemble the JWS. Verification lives beside this in ``broker.verify``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from broker.errors import Reason, UpstreamError
from broker.jwks import kid_for
from broker.vault import TransitKey, VaultClient

ALGORITHM = "Ed25519"  # RFC 9864 fully-specified name (EdDSA is deprecated there)
TOKEN_TYPE = "at+jwt"  # noqa: S105 - the JWT typ header value
MAX_TOKEN_BYTES = 4096
REQUIRED_CLAIMS = ("iss", "sub", "aud", "exp", "nbf", "iat", "jti", "client_id", "grants")


@dataclass(frozen=True)
class GrantClaim:
    purpose: str
    params: Mapping[str, str]

    def to_json(self) -> dict[str, Any]:
        return {"purpose": self.purpose, "params": dict(self.params)}


@dataclass(frozen=True)
class AccessClaims:
    iss: str
    sub: str
    aud: str
    exp: int
    nbf: int
    iat: int
    jti: str
    client_id: str
    grants: tuple[GrantClaim, ...]
    kid: str = ""

    @property
    def run_id(self) -> str:
        return self.sub

    def to_json(self) -> dict[str, Any]:
        return {
            "iss": self.iss, "sub": self.sub, "aud": self.aud, "exp": self.exp, "nbf": self.nbf,
            "iat": self.iat, "jti": self.jti, "client_id": self.client_id,
            "grants": [g.to_json() for g in self.grants],
        }

    @classmethod
    def new(
        cls, *, issuer: str, run_id: str, audience: str, runtime: str,
        grants: tuple[GrantClaim, ...], now: int, ttl: int,
    ) -> AccessClaims:
        return cls(
            iss=issuer, sub=run_id, aud=audience, exp=now + ttl, nbf=now, iat=now,
            jti=secrets.token_urlsafe(16), client_id=runtime, grants=grants,
        )


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _compact_json(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def params_view(params: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(params))


class TransitSigner:
    """Signs JWTs with the latest live version of a transit Ed25519 key.

    The key's metadata (latest version) is cached for ``cache_ttl`` seconds: the version must be
    known before signing because ``kid`` is part of the signed header.
    """

    def __init__(
        self, vault: VaultClient, mount: str, key: str, cache_ttl: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cache_ttl = cache_ttl
        self._vault = vault
        self._mount = mount
        self._key = key
        self._clock = clock
        self._meta: TransitKey | None = None
        self._meta_at = 0.0
        self._lock = asyncio.Lock()

    async def key(self, *, refresh: bool = False) -> TransitKey:
        async with self._lock:
            fresh = self._meta is not None and self._clock() - self._meta_at < self._cache_ttl
            if refresh or not fresh or self._meta is None:
                self._meta = await self._vault.transit_key(self._mount, self._key)
                self._meta_at = self._clock()
            return self._meta

    async def sign(self, claims: list[AccessClaims]) -> list[str]:
        try:
            return await self._sign(claims, await self.key())
        except UpstreamError as exc:
            if exc.reason is not Reason.SIGNING_FAILED:
                raise
            # the cached version may have just been rotated out; retry once with fresh metadata
            return await self._sign(claims, await self.key(refresh=True))

    async def _sign(self, claims: list[AccessClaims], key: TransitKey) -> list[str]:
        header = {"alg": ALGORITHM, "typ": TOKEN_TYPE, "kid": kid_for(key.name, key.latest_version)}
        head = b64url(_compact_json(header))
        inputs = [f"{head}.{b64url(_compact_json(c.to_json()))}" for c in claims]
        signatures = await self._vault.transit_sign(
            self._mount, self._key, [i.encode() for i in inputs], key.latest_version
        )
        return [f"{i}.{b64url(s)}" for i, s in zip(inputs, signatures, strict=True)]
