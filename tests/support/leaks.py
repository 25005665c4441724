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


# Hostile forms (issue #11): the secret folded, in wide encodings, or in part. Each gives the bytes
# the upstream echoes; tests check what the sandbox gets with ``revealed`` rather than exact bytes.
def _folded(blob: bytes, width: int, sep: bytes) -> bytes:
    return sep.join(blob[i:i + width] for i in range(0, len(blob), width))


def _b64_blob(secret: bytes) -> bytes:
    return base64.b64encode(b"-----certificate-like-prefix-----" * 2 + secret + b"trailing-bytes" * 3)


HOSTILE: dict[str, Callable[[str], bytes]] = {
    "b64-mime76-crlf": lambda s: _folded(_b64_blob(s.encode()), 76, b"\r\n"),
    "b64-pem64-lf": lambda s: _folded(_b64_blob(s.encode()), 64, b"\n"),
    "b64-wrap20-space": lambda s: _folded(_b64_blob(s.encode()), 20, b" "),
    "b64-json-newlines": lambda s: _folded(_b64_blob(s.encode()), 64, b"\\n"),
    "b64-secret-folded-at-9": lambda s: _folded(base64.b64encode(s.encode()), 9, b"\r\n "),
    "hex-bytes-spaced": lambda s: b" ".join(b"%02x" % b for b in s.encode()),
    "hex-xxd-groups": lambda s: _folded(s.encode().hex().encode(), 4, b" "),
    "hex-folded-32": lambda s: _folded(s.encode().hex().encode(), 32, b"\n"),
    "hex-colons-upper": lambda s: _folded(s.encode().hex(":").upper().encode(), 45, b"\n    "),
    "utf-16-le": lambda s: s.encode("utf-16-le"),
    "utf-16-be": lambda s: s.encode("utf-16-be"),
    "utf-16-bom": lambda s: s.encode("utf-16"),
    "utf-32-le": lambda s: s.encode("utf-32-le"),
    "utf-32-be": lambda s: s.encode("utf-32-be"),
    "b64-utf-16-le": lambda s: base64.b64encode(("powershell -c echo " + s).encode("utf-16-le")),
    "prefix-12": lambda s: b"Incorrect API key provided: " + s[:12].encode() + b"...",
    "prefix-20": lambda s: b"key " + s[:20].encode() + b"\xe2\x80\xa6 is invalid",
    "suffix-8": lambda s: b"key ending in ..." + s[-8:].encode(),
    "suffix-15": lambda s: b"****************" + s[-15:].encode(),
}


def unfolded(data: bytes) -> bytes:
    """``data`` without the whitespace, colons and escaped line breaks a folding may have put in."""
    for gap in (b"\\r", b"\\n", b"\\t", b"%0A", b"%0D", b"%0a", b"%0d", b"%20", b":"):
        data = data.replace(gap, b"")
    return data.translate(None, b" \t\r\n")


def revealed(secret: str, data: bytes, partial: int = 8) -> list[str]:
    """Names of the ways ``data`` still shows the secret (empty: nothing revealed): verbatim, as
    its base64 at any alignment or hex once whitespace is removed, as UTF-16/32 text, or an
    8-character prefix or suffix."""
    raw = secret.encode()
    found = []
    flat = unfolded(data)
    for k, value in itertools.product(range(3), (raw, secret.encode("utf-16-le"))):
        full = base64.b64encode(bytes(k) + value)
        first, last = -(-8 * k // 6), 8 * (k + len(value)) // 6
        for table in (None, bytes.maketrans(b"+/", b"-_")):
            if full[first:last].translate(table) in flat:
                found.append(f"base64/{k}")
    for name, text in (("hex", raw.hex().encode()), ("HEX", raw.hex().upper().encode())):
        if text in flat:
            found.append(name)
    for codec in ("utf-8", "utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"):
        for shift in range(4):
            text = data[shift:].decode(codec, "replace")
            if secret in text or secret[:partial] in text or secret[-partial:] in text:
                found.append(f"{codec}+{shift}")
    return found


def split_events(form: bytes, style: str, parts: int) -> list[bytes]:
    """Server-sent events carrying ``form`` cut into ``parts`` pieces, as a client would join them:
    ``raw`` data payloads, ``crlf`` the same with CRLF lines and an id field,
    ``openai`` chat.completion.chunk deltas, ``anthropic`` content_block_delta text deltas, ``ndjson``
    JSON lines with a ``response`` delta."""
    text = form.decode("latin-1")
    size = -(-len(text) // parts)
    pieces = ["The key is: " + text[:size]] + [text[i:i + size] for i in range(size, len(text), size)]
    pieces[-1] += " (end)"
    events = []
    for n, piece in enumerate(pieces):
        if style == "raw":
            events.append(b"data: " + piece.encode("latin-1") + b"\n\n")
        elif style == "crlf":
            events.append(b"id: %d\r\ndata:" % n + piece.encode("latin-1") + b"\r\n\r\n")
        elif style == "openai":
            chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-x",
                     "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
            events.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        elif style == "ndjson":  # streamed JSON lines (Ollama-style), not SSE
            events.append(json.dumps({"model": "m", "response": piece, "done": False}).encode() + b"\n")
        elif style == "anthropic":
            delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}
            events.append(b"event: content_block_delta\ndata: " + json.dumps(delta).encode() + b"\n\n")
            if n % 2:
                events.append(b"event: ping\ndata: {\"type\": \"ping\"}\n\n")
    return events


def joined(body: bytes) -> tuple[list[bytes], str, str]:
    """A client's view of an event stream: the raw events, the data payloads joined, and the text
    deltas (OpenAI ``choices[0].delta.content``, Anthropic ``delta.text``) joined."""
    events = [e for e in body.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]
    data, text = [], []
    for event in events:
        payload = b"".join(line[5:].removeprefix(b" ") for line in event.split(b"\n")
                           if line.startswith(b"data:"))
        data.append(payload.decode("utf-8", "replace"))
        try:
            value = json.loads(payload)
        except ValueError:
            continue
        if isinstance(value, dict):
            choices = value.get("choices") or [{}]
            text.append(choices[0].get("delta", {}).get("content") or "")
            text.append(value.get("delta", {}).get("text") or "")
    return events, "".join(data), "".join(text)
