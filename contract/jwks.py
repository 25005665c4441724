"""Signing keys as JWKS: rendered from Vault transit, cached by verifiers.

``kid`` names the transit key and its version (``valetkey-tokens:v3``). A verifier keeps the
current key set in memory; the request path never waits on a fetch:

- ``start()`` loads the set once (a failure raises: a gateway without keys does not start), then
  a background task refreshes it every ``max_age`` seconds, and every ``min_refresh_interval``
  seconds while the source fails;
- ``check()`` (a clock read) fails closed with ``jwks_stale`` once the last good load is older than
  ``max_stale``: retired keys cannot stay trusted for ever behind an unreachable broker;
- ``get(kid)`` answers a known ``kid`` at once. An unknown ``kid`` starts at most one fetch
  (single-flight, and at most once per ``min_refresh_interval``, so a flood of forged kids is not a
  flood of fetches) and waits for it at most ``unknown_kid_wait`` seconds: long enough for a healthy
  broker after a rotation, short enough that a hung one costs a request a fraction of a second.
  Unknown after a good fetch: ``None`` (the caller refuses ``invalid_token``); no good fetch to
  say so: ``Unavailable(jwks_unavailable)``.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from joserfc.errors import JoseError
from joserfc.jwk import OKPKey

from contract.errors import Reason, Unavailable
from contract.tasks import stop_task
from contract.vault import TransitKey

log = logging.getLogger("valetkey.jwks")
JWKS = dict[str, Any]
UNKNOWN_KID_WAIT = 0.25  # seconds a request with an unknown kid waits for the shared fetch
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
                f"JWKS fetch from {url} failed: {type(exc).__name__}", Reason.JWKS_UNAVAILABLE
            ) from None
        if not isinstance(document, dict):
            raise Unavailable(f"JWKS from {url} is not an object", Reason.JWKS_UNAVAILABLE)
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
    """In-memory key set refreshed in the background; ``fetches`` counts network fetches."""

    def __init__(
        self,
        fetch: Fetcher,
        *,
        max_age: float = 300.0,
        max_stale: float = 900.0,
        min_refresh_interval: float = 5.0,
        unknown_kid_wait: float = UNKNOWN_KID_WAIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._max_age = max_age
        self._max_stale = max(max_stale, max_age)
        self._min_interval = min_refresh_interval
        self._kid_wait = unknown_kid_wait
        self._clock = clock
        self._keys: dict[str, OKPKey] = {}
        self._loaded_at: float | None = None
        self._attempted_at: float | None = None
        self._error: Unavailable | None = None  # of the last attempt; None once one succeeds
        self._inflight: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self.fetches = 0

    @property
    def kids(self) -> frozenset[str]:
        return frozenset(self._keys)

    @property
    def fresh(self) -> bool:
        """Loaded, and the last good load is within ``max_stale`` (readiness)."""
        return self._loaded_at is not None and self._clock() - self._loaded_at <= self._max_stale

    def check(self) -> None:
        """The request-path check (no I/O): keys past their bound are not used."""
        if not self.fresh:
            raise Unavailable(
                f"signing keys not refreshed for over {self._max_stale:g}s; refusing until they are",
                Reason.JWKS_STALE,
            )

    async def start(self) -> None:
        """Load now (raises on failure), then keep refreshing in the background."""
        await self.refresh(force=True)
        self._task = asyncio.create_task(self._run(), name="jwks-refresh")

    async def stop(self) -> None:
        await stop_task(self._task)
        await stop_task(self._inflight)
        self._task = self._inflight = None

    async def refresh(self, *, force: bool = False) -> None:
        """Fetch now and wait for it (start-up, tests); raises ``Unavailable`` if it failed."""
        if self._inflight is not None and not self._inflight.done():
            await asyncio.shield(self._inflight)
        task = self._kick(force=force)
        if task is not None:
            await asyncio.shield(task)
        if self._error is not None:
            raise self._error

    async def get(self, kid: str) -> OKPKey | None:
        key = self._keys.get(kid)
        if key is not None:
            return key
        task = self._kick()
        if task is not None:
            await asyncio.wait({task}, timeout=self._kid_wait)  # never cancels the shared fetch
            key = self._keys.get(kid)
            if key is not None:
                return key
            if not task.done():
                raise Unavailable("signing key unknown and the key set is still being fetched",
                                  Reason.JWKS_UNAVAILABLE)
        if self._error is not None:
            raise Unavailable("signing key unknown and the key set cannot be fetched",
                              Reason.JWKS_UNAVAILABLE)
        return None

    def current(self, kid: str) -> bool:
        """Is ``kid`` still in the key set (no I/O)? Used to drop cached verifications."""
        return kid in self._keys

    def _kick(self, *, force: bool = False) -> asyncio.Task[None] | None:
        """The one fetch in flight; a new one unless one was tried within ``min_refresh_interval``."""
        if self._inflight is not None and not self._inflight.done():
            return self._inflight
        now = self._clock()
        if not force and self._attempted_at is not None and now - self._attempted_at < self._min_interval:
            return None
        self._attempted_at = now
        self._inflight = asyncio.create_task(self._load(), name="jwks-fetch")
        return self._inflight

    async def _load(self) -> None:
        self.fetches += 1
        try:
            keys = parse_jwks(await self._fetch())
        except Unavailable as exc:
            self._error = exc
            log.warning('{"event": "jwks_refresh_failed", "reason": "%s"}', exc.code)
            return
        except (ValueError, TypeError, KeyError, JoseError) as exc:  # a key joserfc cannot import
            self._error = Unavailable(f"JWKS holds an unusable key ({type(exc).__name__})",
                                      Reason.JWKS_UNAVAILABLE)
            log.warning('{"event": "jwks_refresh_failed", "reason": "%s"}', self._error.code)
            return
        self._keys, self._loaded_at, self._error = keys, self._clock(), None

    async def _run(self) -> None:
        while True:
            if self._error is None and self._loaded_at is not None:
                due = self._loaded_at + self._max_age
            else:
                due = (self._attempted_at or 0.0) + self._min_interval
            await asyncio.sleep(max(due - self._clock(), 0.01))
            task = self._kick(force=self._error is None)
            if task is not None:
                await task
