"""Redaction of the secrets a gateway holds from everything it returns to the sandbox.

A ``Redactor`` is built once per set of secret values (at load or rotation), never per request.
It knows every *form* of each secret (see ``forms``) and replaces each occurrence with ``MARKER``.
``StreamRedactor`` does the same over a body that arrives in chunks: a match split across chunks
at any offset is caught, and only the bytes that could still begin a match are held back — the
longest suffix that is a prefix of some form — so a finished server-sent event is never delayed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

MARKER = b"[REDACTED:valetkey]"
MIN_SECRET_LENGTH = 4  # shorter values would redact ordinary text; policy secrets are longer


def forms(secret: bytes) -> set[bytes]:
    """The byte forms of one secret that are searched for (extended by the redaction issue)."""
    return {secret}


class Redactor:
    def __init__(self, secrets: Iterable[bytes], extra_forms: Iterable[bytes] = ()) -> None:
        found: set[bytes] = set(extra_forms)
        for secret in secrets:
            if len(secret) >= MIN_SECRET_LENGTH:
                found |= forms(secret)
        self.forms: tuple[bytes, ...] = tuple(sorted((f for f in found if f), key=lambda f: (-len(f), f)))
        self.longest = max((len(f) for f in self.forms), default=0)
        # longest alternatives first, so a longer form wins over one it contains
        self._pattern = re.compile(b"|".join(re.escape(f) for f in self.forms)) if self.forms else None
        self._prefixes = {f[:k] for f in self.forms for k in range(1, len(f) + 1)}

    def __repr__(self) -> str:
        return f"Redactor(forms={len(self.forms)}, longest={self.longest})"

    def redact(self, data: bytes) -> tuple[bytes, int]:
        """Redact a complete value (a header, a status reason); returns (value, count)."""
        if self._pattern is None:
            return data, 0
        out, count = self._pattern.subn(MARKER, data)
        return out, count

    def held_suffix(self, data: bytes) -> int:
        """Length of the longest suffix of ``data`` that could begin a form."""
        for k in range(min(self.longest, len(data)), 0, -1):
            if data[-k:] in self._prefixes:
                return k
        return 0

    def stream(self) -> StreamRedactor:
        return StreamRedactor(self)

    def matches(self, data: bytes) -> Sequence[tuple[int, int]]:
        if self._pattern is None:
            return ()
        return [m.span() for m in self._pattern.finditer(data)]


class StreamRedactor:
    """Chunk-by-chunk redaction with a minimal carry-over; ``count`` totals the redactions."""

    def __init__(self, redactor: Redactor) -> None:
        self._r = redactor
        self._carry = b""
        self.count = 0

    def feed(self, chunk: bytes) -> bytes:
        return self._process(self._carry + chunk, final=False)

    def finish(self) -> bytes:
        return self._process(self._carry, final=True)

    def _process(self, data: bytes, final: bool) -> bytes:
        if not data:
            return b""
        boundary = len(data) if final else len(data) - self._r.held_suffix(data)
        out: list[bytes] = []
        pos = 0
        for start, end in self._r.matches(data):
            if start >= boundary:
                break  # may still grow into a longer form: decide when more bytes arrive
            out.append(data[pos:start])
            out.append(MARKER)
            pos = end
            self.count += 1
        cut = max(pos, boundary)
        out.append(data[pos:cut])
        self._carry = data[cut:]
        return b"".join(out)
