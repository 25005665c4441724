"""The run token contract (RFC 9068 style access tokens): its header, its claims, its encoding.

A token is a compact JWS: header ``{"alg": "Ed25519", "typ": "at+jwt", "kid": "<key>:v<n>"}``,
claims ``iss, sub (run id), aud (one gateway), exp, nbf, iat, jti, client_id (runtime),
grants [{purpose, params}]``. The private key never leaves Vault: we build the signing input,
transit signs it, and we assemble the JWS (``broker.signer``). Verification is ``contract.verify``.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

ALGORITHM = "Ed25519"  # RFC 9864 fully-specified name (EdDSA is deprecated there)
TOKEN_TYPE = "at+jwt"  # noqa: S105 - the JWT typ header value
MAX_TOKEN_BYTES = 4096
MAX_LEEWAY = 60  # seconds of clock skew a verifier may tolerate at most (VALETKEY_TOKEN_LEEWAY)
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


PROXY_GRANT_SEP = "/"  # a proxy token's grant purpose: "<upstream or destination>/<purpose>"


def proxy_purpose(name: str, purpose: str) -> str:
    """``pypi``, ``connect`` → ``pypi/connect``: a grant of the proxy token (policy names never
    contain ``/``, so no upstream's own purpose can be read as one)."""
    return f"{name}{PROXY_GRANT_SEP}{purpose}"


def grants_at(grants: tuple[GrantClaim, ...], name: str) -> tuple[GrantClaim, ...]:
    """The proxy token's grants for upstream or destination ``name``, purposes without the prefix
    (what the gateway pipeline's purpose step expects)."""
    prefix = name + PROXY_GRANT_SEP
    return tuple(GrantClaim(g.purpose[len(prefix):], g.params)
                 for g in grants if g.purpose.startswith(prefix) and len(g.purpose) > len(prefix))


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


def compact_json(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def token_prefix() -> str:
    """What every run token begins with: the base64url of ``{"alg":"Ed25519","kid":"`` (24 bytes,
    so exactly 32 characters whatever follows). The header is serialised with sorted keys
    (``compact_json``), so ``alg`` and ``kid`` always come first: a scanner can tell our tokens
    from other JWTs by this literal."""
    head = compact_json({"alg": ALGORITHM, "kid": ""})[:-2]  # {"alg":"Ed25519","kid":"
    return b64url(head)


def params_view(params: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(params))


SIGNATURE_B64_BYTES = 86  # an Ed25519 signature (64 bytes) in unpadded base64url
MAX_KID_VERSION = 10**9  # the kid's version number is counted at this width


def token_bytes(claims: AccessClaims, key_name: str) -> int:
    """How long the compact JWS of ``claims`` will be (at most), before it is signed: a token
    over ``MAX_TOKEN_BYTES`` would be refused by every verifier, so the broker refuses to mint it."""
    header = {"alg": ALGORITHM, "typ": TOKEN_TYPE, "kid": f"{key_name}:v{MAX_KID_VERSION}"}
    return (len(b64url(compact_json(header))) + 1 + len(b64url(compact_json(claims.to_json())))
            + 1 + SIGNATURE_B64_BYTES)
