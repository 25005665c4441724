"""Every form in which a secret can come back in a response, built once per secret.

A secret reaches a response inside some *text*: the secret itself, its base64 (standard or URL-safe)
at each of the three byte alignments, its hex (lower or upper case). Each character of the secret
(and each ``+ / =`` of its base64; hex and base64 letters and digits are never escaped in practice)
may then be written literally or escaped, independently of its neighbours:

- percent: ``%6a``/``%6A`` (every byte of the character), double-encoded ``%256a``; ``+`` for space;
- JSON: ``\\u006a`` (hex in any case; a surrogate pair above U+FFFF) and ``\\/ \\" \\\\ \\b \\f \\n \\r \\t``;
- HTML/XML: ``&#106;`` and ``&#x6a;``/``&#X6A;`` with up to three leading zeros, and every named
  reference of HTML5 for that character (``&sol;``, ``&equals;``, ``&amp;`` …).

So one pattern per text covers the verbatim text, every fully escaped form and every mix of the two
(an upstream may escape any subset of the characters). Each character is one regex unit whose
alternatives start with distinct bytes, so matching stays linear in the body size.

Base64 at alignment *k* (the secret preceded by *k* unknown bytes inside a longer blob): only the
output characters fully determined by the secret's bits are required; the last partial character
(as it is when the blob ends with the secret) and the ``=`` padding follow as an optional tail.

Also: the secret in UTF-16/32 (``wide_texts``; the marker follows the text's encoding) and the
base64 of its UTF-16LE; base64 and hex *folded* — whitespace, JSON ``\\n`` or ``%0A`` between any
two characters (``FOLD_GAP``, ``FOLD_RUN``); and partial echoes, a prefix or suffix of at least
``PARTIAL_LENGTH`` characters after the provider's public prefix (``partial_texts``).

Not covered: escapes of escapes other than double percent (``%5Cu0061``, JSON inside JSON), HTML
numeric references without ``;`` or with more than three leading zeros, escaped letters or digits
inside the base64 or hex text, mixed-case hex, base64 mixing both alphabets, and anything that
transforms the secret (see docs/redaction.md).
"""

from __future__ import annotations

import base64
import functools
import html
import json
import re
from dataclasses import dataclass, field
from html.entities import html5
from urllib.parse import quote, quote_plus

from gateways.credential_scan import PUBLIC_PREFIXES

Atom = tuple[frozenset[int], int, int]  # allowed bytes, fewest and most repetitions
Alternative = tuple[Atom, ...]
ANCHOR_LENGTH = 8  # bytes of each text's verbatim form the prefilter looks for
# Folding: whitespace an encoder or a mail/PEM/JSON writer puts inside base64 or hex (line breaks
# every 76 or 64 characters, CRLF or LF, JSON "\\n" escapes, percent-encoded breaks, spaces).
# One gap is at most FOLD_GAP of these tokens; the regex allows a gap between any two characters,
# the prefilter finds every occurrence whose lines (runs between gaps) are at least FOLD_RUN
# characters long, and hex broken into 2- or 4-digit groups by single spaces.
FOLD_GAP = 8
FOLD_RUN = 20
FOLD_ANCHORS = 8  # per text; a text longer than 99 characters needs lines of (length - 8) / 7 + 8
_JSON_SHORT = {'"': b'\\"', "\\": b"\\\\", "/": b"\\/", "\b": b"\\b", "\f": b"\\f", "\n": b"\\n",
               "\r": b"\\r", "\t": b"\\t"}
_NAMED: dict[str, list[bytes]] = {}
for _name, _char in html5.items():
    if _name.endswith(";") and len(_char) == 1:
        _NAMED.setdefault(_char, []).append(b"&" + _name.encode())


def _lit(data: bytes) -> Alternative:
    return tuple((frozenset((b,)), 1, 1) for b in data)


def _hex(value: int, width: int) -> Alternative:
    """Hex digits matching either case."""
    return tuple((frozenset(c.encode() + c.upper().encode()), 1, 1) for c in f"{value:0{width}x}")


_ZEROS: Atom = (frozenset(b"0"), 0, 3)


Anchor = tuple[str, bytes]  # (family, bytes): the family's introducer gates its prefilter
# "" is searched always (verbatim anchors); the others only when their introducer occurs (JSON
# \\u escapes: a lone backslash is everywhere in JSON, "\\u" is not in ASCII text)
JSON_FAMILY = "\\u"
FAMILIES = ("", "%", "&#", JSON_FAMILY)


@dataclass(frozen=True)
class Unit:
    """One character of a text: every way it may be written, and the prefilter anchors that every
    escaped way contains (the verbatim way is anchored by its text)."""

    alternatives: tuple[Alternative, ...]
    anchors: frozenset[Anchor]


def _expand(alt: Alternative, first: int, most: int = 4) -> set[bytes]:
    """The byte strings spelled by ``alt[first:]``, stopping before a repeated atom, at
    ``ANCHOR_LENGTH`` bytes, or before the variants (case) would exceed ``most``."""
    out = {b""}
    for chars, low, high in alt[first:first + ANCHOR_LENGTH]:
        if (low, high) != (1, 1) or len(out) * len(chars) > most:
            break
        out = {o + bytes((c,)) for o in out for c in chars}
    return out


@functools.lru_cache(maxsize=4096)
def unit(char: str, raw: bytes, escaped: bool = True) -> Unit:
    """``char`` is the character (for JSON and HTML), ``raw`` its bytes in the text."""
    alts: list[Alternative] = [_lit(raw)]
    anchors: set[Anchor] = set()
    if not escaped:
        return Unit(tuple(alts), frozenset())

    def add(family: str, alt: Alternative, first: int = 0) -> None:
        alts.append(alt)
        anchors.update((family, a) for a in _expand(alt, first))

    add("%", tuple(a for b in raw for a in (*_lit(b"%"), *_hex(b, 2))))
    add("%", tuple(a for b in raw for a in (*_lit(b"%25"), *_hex(b, 2))))
    if char == " ":  # form encoding: "+", and "%2B" once that is encoded again
        add("", _lit(b"+"))
        add("%", (*_lit(b"%2"), (frozenset(b"bB"), 1, 1)))
    code = ord(char)
    if code > 0xFFFF:  # JSON writes characters outside the BMP as a surrogate pair
        high, low = 0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)
        add("\\u", (*_lit(b"\\u"), *_hex(high, 4), *_lit(b"\\u"), *_hex(low, 4)))
    else:
        add("\\u", (*_lit(b"\\u"), *_hex(code, 4)))
    if char in _JSON_SHORT:
        add("", _lit(_JSON_SHORT[char]))
    # numeric references are anchored by their digits and ";" (after the optional zeros)
    add("&#", (*_lit(b"&#"), _ZEROS, *_lit(str(code).encode() + b";")), first=3)
    add("&#", (*_lit(b"&#"), (frozenset(b"xX"), 1, 1), _ZEROS, *_hex(code, len(f"{code:x}")),
               *_lit(b";")), first=4)
    for name in _NAMED.get(char, ()):
        add("", _lit(name))
    return Unit(tuple(alts), frozenset(anchors))


@dataclass(frozen=True)
class Text:
    """A text the secret may appear as: ``required`` verbatim or escaped, then optionally ``tail``."""

    name: str
    required: bytes = field(repr=False)
    tail: bytes = field(default=b"", repr=False)
    escaped: str = "all"  # which characters may be escaped: "all", "punctuation" or "none"
    head: bytes = field(default=b"", repr=False)  # verbatim before ``required``: any suffix of it
    fold: bool = False  # whitespace may be inserted between characters (base64, hex)
    encoding: str = ""  # the marker is written in this encoding (UTF-16/32 texts), else as is

    def units(self) -> tuple[list[Unit], list[Unit]]:
        return units_of(self.required, self.escaped), units_of(self.tail, self.escaped)


    @property
    def anchor(self) -> Anchor:
        return "", self.required[-ANCHOR_LENGTH:]


def units_of(data: bytes, escaped: str) -> list[Unit]:
    return [unit(c, c.encode("utf-8") if ord(c) < 0x80 or _is_utf8 else bytes([ord(c)]),
                 escaped == "all" or (escaped == "punctuation" and not c.isalnum()))
            for c, _is_utf8 in _chars(data)]


def _chars(data: bytes) -> list[tuple[str, bool]]:
    """Characters of ``data``: UTF-8 when it decodes, else one character per byte (Latin-1)."""
    try:
        return [(c, True) for c in data.decode("utf-8")]
    except UnicodeDecodeError:
        return [(c, False) for c in data.decode("latin-1")]


def base64_texts(secret: bytes) -> list[Text]:
    """The secret's base64 at byte alignments 0, 1 and 2, standard and URL-safe alphabets."""
    out: list[Text] = []
    for k in range(3):
        encoded = base64.b64encode(bytes(k) + secret)
        first, last = (8 * k + 5) // 6, (8 * (k + len(secret))) // 6  # fully determined characters
        for alphabet, table in (("std", None), ("url", bytes.maketrans(b"+/", b"-_"))):
            text = encoded.translate(table) if table else encoded
            out.append(Text(f"base64-{alphabet}/{k}", text[first:last], text[last:], "punctuation",
                            fold=True))
    return out


def texts(secret: bytes) -> list[Text]:
    """Every text of one secret, duplicates removed."""
    found = [Text("raw", secret), *base64_texts(secret),
             Text("hex", secret.hex().encode(), escaped="none", fold=True),
             Text("HEX", secret.hex().upper().encode(), escaped="none", fold=True),
             *wide_texts(secret), *partial_texts(secret)]
    seen: set[tuple[bytes, bytes, bytes]] = set()
    unique = []
    for text in found:
        if (text.head, text.required, text.tail) not in seen and text.required:
            seen.add((text.head, text.required, text.tail))
            unique.append(text)
    return unique


def wide_texts(secret: bytes) -> list[Text]:
    """The secret in UTF-16 and UTF-32, either byte order. For characters up to U+00FF one text
    serves both orders: the little-endian bytes without the last character's zero high bytes, which
    follow as an optional tail. Its marker is little-endian, so a redacted body stays valid text in
    either order (big-endian: the zeros before the first character and the marker line up)."""
    text = "".join(c for c, _ in _chars(secret))
    out: list[Text] = []
    for bits in (16, 32):
        zeros = bits // 8 - 1
        if all(ord(c) <= 0xFF for c in text):
            encoded = text.encode(f"utf-{bits}-le")
            out.append(Text(f"utf-{bits}", encoded[:-zeros], bytes(zeros), "none",
                            encoding=f"utf-{bits}-le"))
            if bits == 16:  # base64 of UTF-16LE (PowerShell -EncodedCommand, .NET, NTLM blobs),
                # and UTF-16 of the base64 (a UTF-16 page quoting a Basic header)
                b64 = [t for t in base64_texts(secret) if t.name.startswith("base64-std")]
                out += [Text(f"utf-16-{t.name}", t.required, t.tail, t.escaped)
                        for t in base64_texts(encoded)]
                out += [Text(f"utf-16-of-{t.name}", _le16(t.required)[:-1], b"\0" + _le16(t.tail), "none",
                             encoding="utf-16-le") for t in b64]
        else:
            out += [Text(f"utf-{bits}-{order}", text.encode(f"utf-{bits}-{order}"), escaped="none",
                         encoding=f"utf-{bits}-{order}") for order in ("le", "be")]
    return out


def _le16(ascii_text: bytes) -> bytes:
    return ascii_text.decode("latin-1").encode("utf-16-le")


PARTIAL_LENGTH = 8  # a prefix or suffix of at least this many characters past the public prefix
PARTIAL_REACH = 64  # ... is redacted together with up to this many more characters of the secret


def public_prefix(secret: bytes) -> bytes:
    """The longest provider prefix (``sk-proj-``, ``ghp_``…) the secret starts with; b"" if none."""
    return max((p for p in PUBLIC_PREFIXES if secret.startswith(p)), key=len, default=b"")


def partial_texts(secret: bytes) -> list[Text]:
    """A prefix and a suffix of the secret's variable part (after its public prefix), of at least
    ``PARTIAL_LENGTH`` characters, as error pages print them (``sk-abc12345…``, ``…wxyz9876``)."""
    public = public_prefix(secret)
    chars = _chars(secret[len(public):])
    codec = "utf-8" if all(u for _, u in chars) else "latin-1"
    variable = "".join(c for c, _ in chars)
    if len(variable) <= PARTIAL_LENGTH:
        return []
    start, end = variable[:PARTIAL_LENGTH], variable[-PARTIAL_LENGTH:]
    after = variable[PARTIAL_LENGTH:PARTIAL_LENGTH + PARTIAL_REACH]
    before = variable[-PARTIAL_LENGTH - PARTIAL_REACH:-PARTIAL_LENGTH]
    return [Text("prefix", start.encode(codec), after.encode(codec), "punctuation"),
            Text("suffix", end.encode(codec), escaped="punctuation", head=before.encode(codec))]


def forms(secret: bytes) -> set[bytes]:
    """The enumerated byte forms of one secret; each is redacted whole. The patterns built from
    ``texts`` cover these and every mix of verbatim and escaped characters between them."""
    b64 = [base64.b64encode(secret), base64.urlsafe_b64encode(secret)]
    found = {secret, secret.hex().encode(), secret.hex().upper().encode()}
    for t in base64_texts(secret):
        found |= {t.required, t.required + t.tail, t.required + t.tail.rstrip(b"=")}
    for value in (secret, *b64):
        every = "".join(f"%{b:02X}" for b in value) if value == secret else quote(value, safe="")
        for encoded in (every, quote(value, safe=""), quote_plus(value, safe=""), quote(value, safe="/")):
            for once in (encoded, _lower_hex(encoded)):
                found |= {once.encode(), quote(once, safe="").encode()}
    chars = _chars(secret)
    text = "".join(c for c, _ in chars)
    utf8 = all(is_utf8 for _, is_utf8 in chars)
    codec = "utf-8" if utf8 else "latin-1"
    found |= {json.dumps(text, ensure_ascii=False)[1:-1].encode(codec), json.dumps(text)[1:-1].encode(),
              json.dumps(text, ensure_ascii=False)[1:-1].replace("/", "\\/").encode(codec)}
    every_json = "".join(_json_escape(c) for c in text)
    found |= {every_json.encode(), re.sub("u[0-9a-f]{4}", lambda m: "u" + m.group()[1:].upper(),
                                          every_json).encode()}
    found |= {f.encode(codec) for f in (
        html.escape(text), "".join(_NAMED[c][0].decode() if c in _NAMED else c for c in text),
        "".join(f"&#{ord(c)};" for c in text), "".join(f"&#{ord(c):03d};" for c in text),
        "".join(f"&#x{ord(c):x};" for c in text), "".join(f"&#X{ord(c):X};" for c in text),
        "".join(f"&#x{ord(c):04x};" for c in text),
    )}
    return {f for f in found if f}


def _lower_hex(percent_encoded: str) -> str:
    return re.sub("%[0-9A-F]{2}", lambda m: m.group().lower(), percent_encoded)


def _json_escape(char: str) -> str:
    code = ord(char)
    if code > 0xFFFF:
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"
