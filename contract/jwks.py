"""Signing keys as JWKS: rendered from Vault transit, cached by verifiers.

``kid`` names the transit key and its version (``valetkey-tokens:v3``). A verifier keeps the
current key set in memory, refreshes it every ``max_age`` seconds in the background of normal
use, and on an unknown ``kid`` at most once per ``min_refresh_interval`` (so a flood of forged
kids cannot turn into a flood of fetches).
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from joserfc.jwk import OKPKey

from contract.errors import Reason, Unavailable
from contract.vault import TransitKey

JWKS = dict[str, Any]
Fetcher = Callable[[], Awaitable[JWKS]]


def kid_for(key_name: str, version: int) -> str:
    return f"{key_name}:v{version}"


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def jwks_from_transit(key: TransitKey) -> JWKS:
    """Every live version (min_decryption_version..latest) as an OKP/Ed25519 JWK."""
    return {
        "keys": [
            {
                "kty": "OKP",
                "crv": "Ed25519",
                "x": _b64url(raw),
                "kid": kid_for(key.name, version),
                "use": "sig",
                "alg": "Ed25519",
            }
            for version, raw in sorted(key.public_keys.items(), reverse=True)
        ]
    }


def http_fetcher(url: str, client: httpx.AsyncClient) -> Fetcher:
    """Fetch a JWKS document over HTTP (gateways use the broker's /.well-known/jwks.json)."""

    async def fetch() -> JWKS:
        try:
            response = await client.get(url)
            response.raise_for_status()
            document = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise Unavailable(
                f"JWKS fetch from {url} failed: {type(exc).__name__}", Reason.VAULT_UNAVAILABLE
            ) from None
        if not isinstance(document, dict):
            raise Unavailable(f"JWKS from {url} is not an object", Reason.VAULT_UNAVAILABLE)
        return document

    return fetch


def parse_jwks(document: JWKS) -> dict[str, OKPKey]:
    """Only Ed25519 OKP signing keys with a kid are kept; anything else is ignored."""
    keys: dict[str, OKPKey] = {}
    for entry in document.get("keys", []):
        if not isinstance(entry, dict):
            continue
        if entry.get("kty") != "OKP" or entry.get("crv") != "Ed25519" or "d" in entry:
            continue
        kid = entry.get("kid")
        if isinstance(kid, str) and kid:
            keys[kid] = OKPKey.import_key(
                {"kty": "OKP", "crv": "Ed25519", "x": entry["x"], "kid": kid}
            )
    return keys


class KeyCache:
    """In-memory key set with rate-limited refresh; ``fetches`` counts network fetches."""

    def __init__(
        self,
        fetch: Fetcher,
        *,
        max_age: float = 300.0,
        min_refresh_interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._max_age = max_age
        self._min_interval = min_refresh_interval
        self._clock = clock
        self._keys: dict[str, OKPKey] = {}
        self._loaded_at: float | None = None
        self._attempted_at: float | None = None
        self._lock = asyncio.Lock()
        self.fetches = 0

    @property
    def kids(self) -> frozenset[str]:
        return frozenset(self._keys)

    async def refresh(self, *, force: bool = False) -> None:
        async with self._lock:
            now = self._clock()
            recent = self._attempted_at is not None and now - self._attempted_at < self._min_interval
            if recent and not force:
                return
            self._attempted_at = now
            self.fetches += 1
            self._keys = parse_jwks(await self._fetch())
            self._loaded_at = now

    def stale(self) -> bool:
        """Older than ``max_age`` (or never loaded): the next use refreshes first."""
        return self._loaded_at is None or self._clock() - self._loaded_at > self._max_age

    async def ensure_fresh(self) -> None:
        """Refresh when older than ``max_age`` (cheap clock check otherwise)."""
        if self.stale():
            await self._try_refresh()

    async def _try_refresh(self) -> None:
        try:
            await self.refresh()
        except Unavailable:
            if self._loaded_at is None:
                raise
            # keep serving known keys while the source is briefly unreachable

    async def get(self, kid: str) -> OKPKey | None:
        if self.stale() or kid not in self._keys:
            await self._try_refresh()
        return self._keys.get(kid)

    def current(self, kid: str) -> bool:
        """Is ``kid`` still in the key set (no I/O)? Used to drop cached verifications."""
        return kid in self._keys
