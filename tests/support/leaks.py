"""What a leaky upstream sends back, and what the sandbox must receive instead.

The forms are built here with the standard library only — independently of ``gateways/secret_forms.py``
— so the tests check the redactor against encoders it did not write. Each entry gives the bytes
the upstream echoes and the expected bytes after redaction (the determined part of a longer base64
blob becomes the marker; the rest of the blob stays).
"""

from __future__ import annotations

import base64
import gzip
import html
import itertools
import json
import random
import zlib
from collections.abc import Callable
from urllib.parse import quote, quote_plus

import brotli  # type: ignore[import-untyped]
import zstandard

MARKER = b"[REDACTED:valetkey]"


def _blob(prefix: bytes, secret: bytes, suffix: bytes, url: bool = False, pad: bool = True) -> tuple[bytes, bytes]:
    """base64 of prefix+secret+suffix, and that blob with the secret's determined characters
    (plus, when the secret ends the blob, its last partial character and padding) redacted."""
    encode = base64.urlsafe_b64encode if url else base64.b64encode
    blob = encode(prefix + secret + suffix)
    if not pad:
        blob = blob.rstrip(b"=")
    first, last = -(-8 * len(prefix) // 6), 8 * (len(prefix) + len(secret)) // 6
    return blob, blob[:first] + MARKER + (b"" if not suffix else blob[last:])


def _every_other(secret: str, escape: Callable[[str], str]) -> str:
    return "".join(escape(c) if i % 2 else c for i, c in enumerate(secret))


def _simple(make: Callable[[str], str | bytes]) -> Callable[[str], tuple[bytes, bytes]]:
    def build(secret: str) -> tuple[bytes, bytes]:
        value = make(secret)
        return (value if isinstance(value, bytes) else value.encode()), MARKER
    return build


FORMS: dict[str, Callable[[str], tuple[bytes, bytes]]] = {
    "raw": _simple(lambda s: s),
    "bearer": _simple(lambda s: f"Bearer {s}"),
    "pct-all-upper": _simple(lambda s: "".join(f"%{b:02X}" for b in s.encode())),
    "pct-all-lower": _simple(lambda s: "".join(f"%{b:02x}" for b in s.encode())),
    "pct-unsafe": _simple(lambda s: quote(s, safe="")),
    "pct-plus": _simple(lambda s: quote_plus(s, safe="")),
    "pct-double": _simple(lambda s: quote("".join(f"%{b:02X}" for b in s.encode()), safe="")),
    "pct-double-lower": _simple(lambda s: quote("".join(f"%{b:02x}" for b in s.encode()), safe="")),
    "pct-mixed": _simple(lambda s: _every_other(s, lambda c: f"%{ord(c):02x}")),
    "b64-std": lambda s: _blob(b"", s.encode(), b""),
    "b64-std-unpadded": lambda s: _blob(b"", s.encode(), b"", pad=False),
    "b64-url": lambda s: _blob(b"", s.encode(), b"", url=True),
    "b64-url-unpadded": lambda s: _blob(b"", s.encode(), b"", url=True, pad=False),
    "b64-align1": lambda s: _blob(b"\x01", s.encode(), b"\xff\xfe\xfd"),
    "b64-align2": lambda s: _blob(b"\x01\x02", s.encode(), b"\xff\xfe\xfd"),
    "b64-align0-inside": lambda s: _blob(b"\x01\x02\x03", s.encode(), b"\xff\xfe\xfd", url=True),
    "b64-basic": lambda s: _blob(b"x-access-token:", s.encode(), b""),
    "b64-pct": lambda s: (quote(base64.b64encode(b"u:" + s.encode()).decode(), safe="").encode(),
                          _pct_blob(b"u:", s.encode())),
    "json-dumps": _simple(lambda s: json.dumps(s)[1:-1]),
    "json-u-lower": _simple(lambda s: "".join(f"\\u{ord(c):04x}" for c in s)),
    "json-u-upper": _simple(lambda s: "".join(f"\\u{ord(c):04X}" for c in s)),
    "json-mixed": _simple(lambda s: _every_other(s, lambda c: f"\\u{ord(c):04x}")),
    "html-escape": _simple(lambda s: html.escape(s)),
    "html-dec": _simple(lambda s: "".join(f"&#{ord(c)};" for c in s)),
    "html-dec-zeros": _simple(lambda s: "".join(f"&#{ord(c):04d};" for c in s)),
    "html-hex-lower": _simple(lambda s: "".join(f"&#x{ord(c):x};" for c in s)),
    "html-hex-upper": _simple(lambda s: "".join(f"&#X{ord(c):X};" for c in s)),
    "html-mixed": _simple(lambda s: _every_other(s, lambda c: f"&#x{ord(c):04x};")),
    "hex-lower": _simple(lambda s: s.encode().hex()),
    "hex-upper": _simple(lambda s: s.encode().hex().upper()),
}


def _pct_blob(prefix: bytes, secret: bytes) -> bytes:
    blob = base64.b64encode(prefix + secret).decode()
    first = -(-8 * len(prefix) // 6)
    return quote(blob[:first], safe="").encode() + MARKER


HEADERS: dict[str, Callable[[bytes], bytes]] = {
    "location": lambda f: b"https://elsewhere.example/callback?token=" + f + b"&state=1",
    "set-cookie": lambda f: b"session=" + f + b"; Path=/; HttpOnly",
    "www-authenticate": lambda f: b'Bearer error="invalid_token", error_description="bad token ' + f + b'"',
    "link": lambda f: b"<https://elsewhere.example/next?token=" + f + b'>; rel="next"',
    "content-location": lambda f: b"/v1/items?token=" + f,
    "refresh": lambda f: b"0; url=/login?token=" + f,
    "x-debug-echo": lambda f: f,
}


def filler(size: int, seed: int) -> bytes:
    """Deterministic JSON-ish text that holds no part of any form."""
    rnd = random.Random(seed)
    words = [b"issue", b"comment", b"state", b"open", b"title", b"the", b"when", b"labels", b"null"]
    out = bytearray()
    while len(out) < size:
        out += b'{"%s": "%s %s"},\n' % (rnd.choice(words), rnd.choice(words), rnd.choice(words))
    return bytes(out[:size])


def leak_body(form: bytes, redacted: bytes, size: int) -> tuple[bytes, bytes]:
    """A body holding ``form`` (several times when large) and the body the sandbox must get."""
    if size <= 256:
        return b'{"debug": "' + form + b'", "n": 1}\n', b'{"debug": "' + redacted + b'", "n": 1}\n'
    text = filler(size, seed=size)
    cuts = sorted({0, 65536 - len(form) // 2, 65536 * 3 - 1, size // 2, size})
    body, expected = [], []
    for a, b in itertools.pairwise(cuts):
        body += [text[a:b], b" " + form + b" "]
        expected += [text[a:b], b" " + redacted + b" "]
    return b"".join(body), b"".join(expected)


def encode(body: bytes, codings: str) -> bytes:
    """Apply Content-Encoding codings in order ("gzip, br" = gzip first); "corrupt" breaks it."""
    for coding in (c.strip() for c in codings.split(",") if c.strip()):
        if coding == "gzip":
            body = gzip.compress(body)
        elif coding == "deflate":
            body = zlib.compress(body)
        elif coding == "deflate-raw":
            compressor = zlib.compressobj(wbits=-15)
            body = compressor.compress(body) + compressor.flush()
        elif coding == "br":
            body = brotli.compress(body, quality=5)
        elif coding == "zstd":
            body = zstandard.ZstdCompressor(write_checksum=True).compress(body)
        elif coding == "corrupt":  # breaks the stream at its start: nothing decodes
            body = body[:10] + bytes(b ^ 0x5A for b in body[10:40]) + body[40:]
        elif coding == "corrupt-late":  # breaks it far in, after the first bytes have decoded
            at = len(body) * 3 // 5
            body = body[:at] + bytes(b ^ 0x5A for b in body[at:at + 64]) + body[at + 64:]
        elif coding == "bomb":  # 100 MB of zeros in a few KiB of zstd, whatever the body was
            body = zstandard.ZstdCompressor().compress(bytes(100_000_000))
    return body


def header_coding(codings: str) -> bytes:
    names = [{"deflate-raw": "deflate", "bomb": "zstd"}.get(c.strip(), c.strip()) for c in codings.split(",")]
    return ", ".join(n for n in names if not n.startswith("corrupt")).encode()
