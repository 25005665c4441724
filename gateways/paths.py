"""Request-target canonicalisation, done once before matching.

The decision must be about the same path the upstream will see, so the gateway decodes each
segment exactly once, refuses anything whose meaning differs between parsers, and forwards the
re-encoded canonical form it matched — never the client's raw bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, unquote_to_bytes

from contract.errors import BadRequest, Forbidden, Reason

MAX_TARGET = 8192
_BAD_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")
_SAFE = "-._~!$&'()*+,=:@"


@dataclass(frozen=True)
class CanonicalPath:
    segments: tuple[str, ...]
    raw: str  # re-encoded path sent upstream

    def __str__(self) -> str:
        return self.raw


def _refuse(why: str) -> Forbidden:
    return Forbidden(f"path is not canonical: {why}", Reason.PURPOSE_NOT_GRANTED)


def canonical_path(raw_path: bytes) -> CanonicalPath:
    """Decode ``raw_path`` once into segments; refuse what parsers could read differently."""
    if len(raw_path) > MAX_TARGET:
        raise BadRequest("request target too long", Reason.INVALID_REQUEST)
    if not raw_path.startswith(b"/"):
        raise BadRequest("only origin-form request targets are accepted", Reason.ABSOLUTE_FORM_TARGET)
    if raw_path == b"/":
        return CanonicalPath((), "/")
    if _BAD_ESCAPE.search(raw_path):
        raise _refuse("malformed percent-escape")
    segments: list[str] = []
    parts = raw_path[1:].split(b"/")
    for index, raw in enumerate(parts):
        decoded = unquote_to_bytes(raw)
        try:
            text = decoded.decode("utf-8")
        except UnicodeDecodeError:
            raise _refuse("segment is not UTF-8") from None
        if text in (".", "..") or (text == "" and index < len(parts) - 1):
            # one final empty segment is a trailing slash (`/simple/requests/`), kept as such:
            # only a template that ends in '/' (or '/**') matches it
            raise _refuse("empty, '.' or '..' segment")
        if any(c in text for c in "/\\;%") or not text.isprintable():
            raise _refuse("encoded '/', '\\', ';', '%' or a control character in a segment")
        segments.append(text)
    return CanonicalPath(tuple(segments), "/" + "/".join(quote(s, safe=_SAFE) for s in segments))
