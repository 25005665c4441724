"""Run token verification: the function every gateway calls.

Two explicit steps, as in joserfc: (1) the JWS — size cap, strict structure, header with exact
``typ``, allowlisted ``alg`` and a known ``kid``, signature; (2) the claims — required members
present and typed, ``iss`` exact, one audience equal to the verifier's, exp/nbf/iat with a small
leeway and injectable ``now``. Then the run must be live.

A token has one spelling: every segment is canonical base64url (no padding, zero trailing bits),
and header and payload are UTF-8 JSON objects in the one strict profile of ``contract.strictjson``
(no BOM, no member name twice — parsers disagree on which one wins —, no NaN, bounded depth and
numbers). Every failure is ``TokenInvalid`` with ``check`` naming the step (``size``, ``format``,
``encoding``, ``json``, then the header member or claim); the audience failure carries reason
``audience_mismatch``.

Signature results are cached by token hash (never the raw token), so a repeated token costs a
dict lookup; time, audience and run checks still run on every call. The key set is refreshed in
the background (``contract/jwks.py``): verification never waits on a JWKS fetch, except up to
``UNKNOWN_KID_WAIT`` for a ``kid`` the set does not hold yet.

The signature is checked with ``cryptography``'s Ed25519 (the primitive joserfc itself calls) over
the signing input of the token we already parsed strictly: joserfc's ``deserialize_compact``
would decode and parse header and payload a second time, about a fifth of a verification.
joserfc still imports the JWKS keys (``contract/jwks.py``).
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from contract.claims import (
    ALGORITHM,
    MAX_TOKEN_BYTES,
    REQUIRED_CLAIMS,
    TOKEN_TYPE,
    AccessClaims,
    GrantClaim,
    b64url_decode,
    params_view,
)
from contract.errors import BadRequest, Reason, TokenInvalid
from contract.jwks import KeyCache
from contract.secret import token_hash
from contract.strictjson import parse_object

ALGORITHMS = (ALGORITHM,)
DEFAULT_LEEWAY = 5  # seconds of clock skew tolerated on exp, nbf and iat
MAX_LIFETIME = 24 * 3600
CACHE_SIZE = 10_000
_SEGMENT = re.compile(r"^[A-Za-z0-9_-]+$")
_HEADER_MEMBERS = frozenset({"alg", "kid", "typ"})  # exactly what TransitSigner writes

RunCheck = Callable[[AccessClaims], Awaitable[None]]


def _fail(check: str, detail: str) -> TokenInvalid:
    return TokenInvalid(f"token rejected: {detail}", check=check)


def _decode(segment: str, what: str) -> bytes:
    try:
        return b64url_decode(segment)
    except ValueError as exc:
        raise _fail("encoding", f"{what} is not canonical base64url ({exc})") from None


def _segment_json(segment: str, what: str) -> dict[str, Any]:
    try:
        return parse_object(_decode(segment, what), what)
    except BadRequest as exc:
        raise _fail("json", exc.detail) from None


def parse_header(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Structure, encoding and header checks; returns (header, payload), each decoded from
    canonical base64url and parsed in the one JSON profile (``contract.strictjson``)."""
    if len(token) > MAX_TOKEN_BYTES:
        raise _fail("size", f"longer than {MAX_TOKEN_BYTES} bytes")
    parts = token.split(".")
    if len(parts) != 3 or not all(_SEGMENT.fullmatch(p) for p in parts):
        raise _fail("format", "not a compact JWS with three base64url segments")
    _decode(parts[2], "signature")  # every segment has one spelling, the signature too
    header = _segment_json(parts[0], "header")
    payload = _segment_json(parts[1], "payload")
    if header.get("typ") != TOKEN_TYPE:
        raise _fail("typ", f"typ must be {TOKEN_TYPE!r}")
    if header.get("alg") not in ALGORITHMS:
        raise _fail("alg", f"alg must be one of {list(ALGORITHMS)}")
    if set(header) != _HEADER_MEMBERS:  # crit, jku, jwk, x5u, b64, zip... and anything unknown
        raise _fail("header", "header carries a member valetkey never issues")
    if not isinstance(header.get("kid"), str) or not header["kid"]:
        raise _fail("kid", "header has no kid")
    return header, payload


def _int_claim(payload: dict[str, Any], name: str) -> int:
    value = payload[name]
    if not isinstance(value, int) or isinstance(value, bool):
        raise _fail(name, f"{name} must be an integer NumericDate")
    return value


def _str_claim(payload: dict[str, Any], name: str) -> str:
    value = payload[name]
    if not isinstance(value, str) or not value:
        raise _fail(name, f"{name} must be a non-empty string")
    return value


def _grants(payload: dict[str, Any]) -> tuple[GrantClaim, ...]:
    raw = payload["grants"]
    if not isinstance(raw, list) or not raw:
        raise _fail("grants", "grants must be a non-empty list")
    out: list[GrantClaim] = []
    for item in raw:
        if not isinstance(item, dict) or set(item) != {"purpose", "params"}:
            raise _fail("grants", "each grant needs exactly purpose and params")
        purpose, params = item["purpose"], item["params"]
        if not isinstance(purpose, str) or not isinstance(params, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in params.items()
        ):
            raise _fail("grants", "grant purpose and params must be strings")
        out.append(GrantClaim(purpose, params_view(params)))
    return tuple(out)


def claims_from_payload(payload: dict[str, Any], kid: str) -> AccessClaims:
    """Shape check of the payload: every required claim present and of the right type."""
    for name in REQUIRED_CLAIMS:
        if name not in payload:
            raise _fail(name, f"required claim {name} is missing")
    return AccessClaims(
        iss=_str_claim(payload, "iss"), sub=_str_claim(payload, "sub"),
        aud=_str_claim(payload, "aud"), exp=_int_claim(payload, "exp"),
        nbf=_int_claim(payload, "nbf"), iat=_int_claim(payload, "iat"),
        jti=_str_claim(payload, "jti"), client_id=_str_claim(payload, "client_id"),
        grants=_grants(payload), kid=kid,
    )


def validate_claims(
    claims: AccessClaims, *, issuer: str, audience: str, now: float, leeway: int
) -> None:
    """The time-independent and time-dependent claim rules, in a fixed order."""
    if claims.iss != issuer:
        raise _fail("iss", "issuer is not this broker")
    if claims.aud != audience:
        raise TokenInvalid(
            "token rejected: issued for another gateway", check="aud",
            reason=Reason.AUDIENCE_MISMATCH,
        )
    if claims.exp <= now - leeway:
        raise _fail("exp", "token expired")
    if claims.nbf > now + leeway:
        raise _fail("nbf", "token not yet valid")
    if claims.iat > now + leeway:
        raise _fail("iat", "token issued in the future")
    if claims.exp - claims.iat > MAX_LIFETIME or claims.exp <= claims.nbf:
        raise _fail("exp", "token lifetime is out of bounds")


def verify_signature(token: str, public_key: object) -> None:
    """Ed25519 over ``header.payload`` (ASCII, as parsed); the signature is exactly 64 bytes."""
    if not isinstance(public_key, Ed25519PublicKey):
        raise _fail("kid", "signing key is not an Ed25519 key")
    signing_input, _, encoded = token.rpartition(".")
    try:
        signature = b64url_decode(encoded)
        if len(signature) != 64:
            raise InvalidSignature
        public_key.verify(signature, signing_input.encode("ascii"))
    except (InvalidSignature, ValueError) as exc:
        raise _fail("signature", f"signature does not verify ({type(exc).__name__})") from None


class TokenVerifier:
    """Verifies run tokens for one audience (a gateway's upstream name)."""

    def __init__(
        self,
        *,
        issuer: str,
        audience: str,
        keys: KeyCache,
        run_check: RunCheck | None = None,
        leeway: int = DEFAULT_LEEWAY,
        now: Callable[[], float] = time.time,
        cache_size: int = CACHE_SIZE,
    ) -> None:
        self.issuer = issuer
        self.audience = audience
        self.keys = keys
        self._run_check = run_check
        self._leeway = leeway
        self._now = now
        self._cache: OrderedDict[str, AccessClaims] = OrderedDict()
        self._cache_size = cache_size

    async def verify(self, token: str) -> AccessClaims:
        claims = await self._signed_claims(token)
        try:
            validate_claims(
                claims, issuer=self.issuer, audience=self.audience, now=self._now(),
                leeway=self._leeway,
            )
            if self._run_check is not None:
                await self._run_check(claims)
        except TokenInvalid as exc:
            exc.claims = claims if claims.iss == self.issuer else None
            raise
        return claims

    async def _signed_claims(self, token: str) -> AccessClaims:
        self.keys.check()  # a clock read: keys past their bound are not used (jwks_stale)
        key = token_hash(token) if len(token) <= MAX_TOKEN_BYTES else ""
        cached = self._cache.get(key) if key else None
        if cached is not None and self.keys.current(cached.kid):
            self._cache.move_to_end(key)
            return cached
        header, payload = parse_header(token)
        jwk = await self.keys.get(header["kid"])
        if jwk is None:
            raise _fail("kid", "signing key is unknown or retired")
        verify_signature(token, jwk.public_key)
        claims = claims_from_payload(payload, header["kid"])
        self._cache[key] = claims
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return claims
