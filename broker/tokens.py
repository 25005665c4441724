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
import re
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
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
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


def b64url_decode(text: str) -> bytes:
    """The bytes of canonical unpadded base64url (RFC 7515 section 2), else ``ValueError``.

    Canonical: only the 64-character alphabet, no padding or whitespace, and zero trailing bits,
    so each byte string has exactly one spelling (``...Q`` and ``...R`` may decode alike, but
    only one of them is what ``b64url`` writes)."""
    if not _B64URL.fullmatch(text) or len(text) % 4 == 1:
        raise ValueError("not base64url")
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if b64url(raw) != text:
        raise ValueError("base64url with non-zero trailing bits")
    return raw


def _compact_json(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def params_view(params: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(params))


Pending = tuple[list[AccessClaims], "asyncio.Future[list[str]]"]  # claims to sign, who awaits them


class TransitSigner:
    """Signs JWTs with the latest live version of a transit Ed25519 key.

    The key's metadata (latest version) is cached for ``cache_ttl`` seconds: the version must be
    known before signing because ``kid`` is part of the signed header.

    Concurrent ``sign`` calls share Vault calls (group commit): while one transit call is in
    flight, new requests queue, and the next call signs all of them (``batch_input``, at most
    ``MAX_BATCH`` tokens). An idle broker signs at once; a busy one makes far fewer Vault calls
    (one per ~2 ms instead of one per mint). A failed call fails every request in its batch.
    """

    MAX_BATCH = 256

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
        self._queue: list[Pending] = []
        self._flusher: asyncio.Task[None] | None = None

    async def key(self, *, refresh: bool = False) -> TransitKey:
        async with self._lock:
            fresh = self._meta is not None and self._clock() - self._meta_at < self._cache_ttl
            if refresh or not fresh or self._meta is None:
                self._meta = await self._vault.transit_key(self._mount, self._key)
                self._meta_at = self._clock()
            return self._meta

    async def sign(self, claims: list[AccessClaims]) -> list[str]:
        """One token per claims, signed in a Vault call shared with concurrent callers."""
        if not claims:
            return []
        future: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        self._queue.append((claims, future))
        if self._flusher is None or self._flusher.done():  # done: its loop ended under it
            self._flusher = asyncio.create_task(self._flush(), name="transit-sign-batches")
            self._flusher.add_done_callback(self._stopped)
        return await future

    async def _flush(self) -> None:
        while self._queue:
            batch: list[Pending] = []
            size = 0
            while self._queue and (not batch or size + len(self._queue[0][0]) <= self.MAX_BATCH):
                batch.append(self._queue.pop(0))
                size += len(batch[-1][0])
            await self._sign_batch(batch)

    def _stopped(self, flusher: asyncio.Task[None]) -> None:
        """The flusher ended. Cancelled (shutting down, even before it ran): nobody still queued
        waits forever."""
        if flusher.cancelled():
            for _, future in self._queue:
                future.cancel()
            self._queue.clear()
        if self._flusher is flusher:
            self._flusher = None

    async def _sign_batch(self, batch: list[Pending]) -> None:
        try:
            tokens = await self._sign_now([c for claims, _ in batch for c in claims])
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:  # every caller of the batch gets the failure
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        start = 0
        for claims, future in batch:
            if not future.done():  # a caller that went away (cancelled) is skipped
                future.set_result(tokens[start : start + len(claims)])
            start += len(claims)

    async def _sign_now(self, claims: list[AccessClaims]) -> list[str]:
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
