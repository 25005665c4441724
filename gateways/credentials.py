"""Where the placeholder is read from, which client headers never leave, and where the secret goes.

The placeholder is read from exactly the place the upstream's policy says the credential goes.
Every client credential — the placeholder included — is stripped before the request is built;
the upstream sees only the injected secret.
"""

from __future__ import annotations

import base64
import binascii
from functools import lru_cache
from urllib.parse import parse_qsl, urlencode

from contract.errors import Reason, Unauthenticated
from contract.secret import Secret
from policies.credential_names import MAX_NAME, is_credential_name
from policies.model import Injection, Placement

Headers = list[tuple[bytes, bytes]]

HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding",
    b"upgrade",
})
# Client headers that never reach the upstream: credentials, routing hints, framing we recompute,
# and what would let a slice or a compressed form of a response slip past redaction.
STRIPPED = HOP_BY_HOP | frozenset({
    b"host", b"content-length", b"expect",
    b"authorization", b"proxy-authorization", b"cookie",
    b"x-api-key", b"api-key", b"x-auth-token", b"x-access-token", b"private-token",
    b"x-goog-api-key", b"x-amz-security-token",
    b"forwarded", b"x-real-ip", b"x-original-url", b"x-rewrite-url", b"x-original-host",
    b"x-http-method-override", b"x-http-method", b"x-method-override",
    b"range", b"if-range", b"accept-encoding",
})
STRIPPED_PREFIXES = (b"x-forwarded-", b"proxy-", b"x-valetkey-")


def _challenge(injection: Injection, realm: str) -> str:
    if injection.placement is Placement.BASIC:
        return f'Basic realm="{realm}", charset="UTF-8"'
    return f'Bearer realm="{realm}"'


def missing(injection: Injection, realm: str, detail: str) -> Unauthenticated:
    error = Unauthenticated(detail, Reason.MISSING_TOKEN)
    error.headers = {"www-authenticate": _challenge(injection, realm)}
    return error


def header_value(headers: Headers, name: bytes) -> str | None:
    values = [v for k, v in headers if k == name]
    if len(values) != 1:
        return None  # absent, or sent twice: ambiguous, so not a credential we accept
    return values[0].decode("latin-1")


def decode_basic(value: str) -> tuple[str, str] | None:
    scheme, _, encoded = value.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return (user, password) if sep else None


def _from_format(value: str, fmt: str) -> str | None:
    prefix, _, suffix = fmt.partition("{secret}")
    if value[: len(prefix)].lower() != prefix.lower() or not value.endswith(suffix):
        return None
    token = value[len(prefix) : len(value) - len(suffix) if suffix else None].strip()
    return token or None


def extract_placeholder(injection: Injection, headers: Headers, query: bytes, realm: str) -> str:
    """The run token from where the policy puts the credential, or a 401 with a challenge."""
    token: str | None = None
    if injection.placement is Placement.HEADER:
        for name, fmt in ((injection.header, injection.format), *injection.accept):
            value = header_value(headers, name.lower().encode())
            token = _from_format(value, fmt) if value else None
            if token:
                break
    elif injection.placement is Placement.BASIC:
        value = header_value(headers, b"authorization")
        pair = decode_basic(value) if value else None
        if pair is not None:
            user, password = pair
            token = password or (user if user.count(".") == 2 else None)
    else:
        values = [v for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True)
                  if k == injection.param]
        token = values[0] if len(values) == 1 and values[0] else None
    if not token:
        raise missing(injection, realm, "send the run token where the placeholder goes")
    return token


def forwarded_headers(headers: Headers, injection: Injection) -> Headers:
    """Client headers minus every credential (the listed ones and every credential-named one,
    ``X-Service-Token``…), hop-by-hop and routing header."""
    named_hop = {
        part.strip().lower().encode()
        for k, v in headers if k == b"connection"
        for part in v.decode("latin-1").split(",") if part.strip()
    }
    injected = {n.encode() for n in injection.header_names()}
    return [
        (k, v) for k, v in headers
        if k not in STRIPPED and k not in named_hop and k not in injected
        and not k.startswith(STRIPPED_PREFIXES) and not _credential_header(k[:MAX_NAME])
    ]


@lru_cache(maxsize=1024)  # the same few header names come with every request
def _credential_header(name: bytes) -> bool:
    return is_credential_name(name.decode("latin-1"))


def inject(headers: Headers, query: bytes, injection: Injection, secret: Secret) -> tuple[Headers, bytes]:
    """Put the real secret on the wire; returns (headers, query) for the upstream request."""
    out = [*headers, (b"accept-encoding", b"identity")]
    if injection.placement is Placement.HEADER:
        value = injection.format.replace("{secret}", secret.reveal())
        out.append((injection.header.lower().encode(), value.encode("latin-1")))
    elif injection.placement is Placement.BASIC:
        pair = f"{injection.username}:{secret.reveal()}".encode()
        out.append((b"authorization", b"Basic " + base64.b64encode(pair)))
    else:
        pairs = [(k, v) for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True)
                 if k != injection.param]
        pairs.append((injection.param, secret.reveal()))
        query = urlencode(pairs).encode("latin-1")
    return out, query


def strip_query_param(query: bytes, param: str) -> bytes:
    pairs = [(k, v) for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True) if k != param]
    return urlencode(pairs).encode("latin-1")
