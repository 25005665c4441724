"""Redaction of the secrets a gateway holds from everything it returns to the sandbox.

A ``Redactor`` is built once per set of secret values (at load or rotation), never per request.
It knows every *text* of each secret (``gateways/secret_forms.py``: the secret, its base64 at each
alignment, its hex — each character verbatim or escaped) plus the literal forms the injection
produced, and replaces each occurrence with ``MARKER``.

Matching is two steps, so the cost stays linear and close to memory speed when nothing matches:
a SIMD multi-literal prefilter (Aho-Corasick, leftmost-first, which uses Teddy) finds *anchors* —
a short verbatim piece of each text, and the first bytes of every escape — and every occurrence
contains at least one. Only a window of ``longest`` bytes around each hit is then searched with
the exact regex of each text; the leftmost occurrence wins, and of those starting at the same
byte the longest.

``StreamRedactor`` does the same over a body that arrives in chunks: a match split across chunks
at any offset is caught, and only the bytes that could still begin a match are held back — the
longest suffix that is a prefix of some occurrence. Its output equals ``Redactor.redact`` of the
whole body, whatever the chunking. (Event streams go through ``gateways/sse.py``, which redacts
what a client joins across events and uses the same two questions: ``spans`` and
``held_suffix``.)
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ahocorasick_rs import MATCHKIND_LEFTMOST_FIRST, BytesAhoCorasick

from gateways.secret_forms import FAMILIES, JSON_FAMILY, Anchor, Text, forms, texts
from gateways.spliced_regex import alternation, concatenation
from gateways.text_regex import Follow, Lead, compile_text

__all__ = ["MARKER", "MIN_SECRET_LENGTH", "Redactor", "StreamRedactor", "forms"]

MARKER = b"[REDACTED:valetkey]"
MIN_SECRET_LENGTH = 4  # shorter values would redact ordinary text; policy secrets are longer
# Teddy (the SIMD searcher) takes at most 64 patterns; past that the automaton runs about 10x
# slower, so more anchors (folded forms, rotated secrets) are split into automata of this many
TEDDY_PATTERNS = 64
WARM_SAMPLE = bytes(range(0x20, 0x7F))  # see Redactor.warm
_SENTINEL = 1 << 62  # the mask bit of the "\\u" sentinel (no redactor has that many texts)
_JSON_GATE = JSON_FAMILY.encode()
Span = tuple[int, int, bytes]  # start, end, the marker that replaces it


@dataclass(frozen=True, repr=False)
class _Matcher:
    full: re.Pattern[bytes]
    prefix: re.Pattern[bytes]
    longest: int
    marker: bytes  # MARKER, in the text's own encoding (UTF-16/32)
    head: bytes  # a match extends back over any suffix of this (a partial echo's earlier part)
    fixed: bool  # no optional tail and no folding: a whole occurrence cannot grow
    leads: tuple[Lead, ...]  # ``prefix`` by its first byte


@functools.lru_cache(maxsize=64)  # a rotation recompiles only the new secret's texts
def _matcher(text: Text) -> tuple[_Matcher, frozenset[Anchor], frozenset[int]]:
    compiled = compile_text(text)
    marker = MARKER.decode().encode(text.encoding) if text.encoding else MARKER
    # spliced from cached per-character pieces: a new secret costs milliseconds (spliced_regex.py)
    matcher = _Matcher(concatenation(compiled.full_pieces), concatenation(compiled.prefix_pieces),
                       compiled.longest, marker, text.head,
                       not text.tail and not text.fold, compiled.leads)
    return matcher, compiled.anchors, compiled.alphabet


class Redactor:
    def __init__(self, secrets: Iterable[bytes], extra_forms: Iterable[bytes] = ()) -> None:
        for _ in self._build(secrets, extra_forms):
            pass

    @classmethod
    async def build(cls, secrets: Iterable[bytes], extra_forms: Iterable[bytes] = ()) -> Redactor:
        """``Redactor(secrets, extra_forms)``, built on the event loop in steps of a millisecond or
        two, yielding between them: a thread would hold the GIL the loop needs for tens of ms at a
        time (the GIL changes hands every 5 ms, and each loop turn needs it), a step cannot."""
        redactor = cls.__new__(cls)
        for _ in redactor._build(secrets, extra_forms):
            await asyncio.sleep(0)
        return redactor

    @classmethod
    async def warm(cls) -> None:
        """Compile the pieces of every printable ASCII character in each of its texts (raw, base64,
        hex, UTF-16/32) once, at start-up, so the first issued credential's build is as quick as
        every later one's (a piece costs a parse and a compile the first time it is met)."""
        await cls.build([WARM_SAMPLE, WARM_SAMPLE[::-1]])

    def _build(self, secrets: Iterable[bytes], extra_forms: Iterable[bytes]) -> Iterator[None]:
        """Builds the redactor; yields between steps (one text, one prefilter) where the caller
        may run other work."""
        found: list[Text] = [t for s in secrets if len(s) >= MIN_SECRET_LENGTH for t in texts(s)]
        found += [Text("injected", f, escaped="none") for f in extra_forms if len(f) >= MIN_SECRET_LENGTH]
        owners: dict[Anchor, int] = {}  # anchor → bitmask of the texts it anchors
        alphabet: set[int] = set()
        self._matchers: list[_Matcher] = []
        for text in dict.fromkeys(found):
            yield
            matcher, text_anchors, text_alphabet = _matcher(text)
            for anchor in text_anchors:
                owners[anchor] = owners.get(anchor, 0) | 1 << len(self._matchers)
            self._matchers.append(matcher)
            alphabet |= text_alphabet
        yield
        self.texts = len(self._matchers)
        self.longest = max((m.longest for m in self._matchers), default=0)
        self.alphabet = bytes(sorted(alphabet))  # every byte any occurrence can hold
        # 2 for the bytes no occurrence can hold, 1 for those one can start with, 0 for the rest:
        # one translate, then rfind finds the last byte outside the alphabet and find the first
        # possible start after it (bytes.rstrip(chars) costs a memchr per byte)
        starts = {byte for m in self._matchers for byte, _, _ in m.leads}
        self._classes = bytes(2 if b not in alphabet else 1 if b in starts else 0 for b in range(256))
        self._held: list[tuple[int, re.Pattern[bytes]]] = []
        for reach, branches in _held_groups(self._matchers):
            yield
            self._held.append((reach, _spliced(branches)))
        yield
        # One automaton per escape family, searched only when the first byte of its introducer
        # occurs (a memchr): the always-on one stays small (a few verbatim anchors), so it runs as
        # Teddy. Each pattern carries the texts to verify around a hit of it.
        # JSON escapes have their own automaton, run only when the always-on one meets "\\u…" (a
        # sentinel pattern there: Teddy finds it for free, where `b"\\u" in data` costs a pass)
        # (3 bytes each: the first 3 of every escape anchor, as Teddy fingerprints 3 bytes at most)
        for sentinel in {a[:3] for f, a in owners if f == JSON_FAMILY}:
            owners["", sentinel] = owners.get(("", sentinel), 0) | _SENTINEL
        self._prefilters: list[tuple[bytes, BytesAhoCorasick, list[int]]] = []
        for family in FAMILIES:
            patterns = sorted(a for f, a in owners if f == family)
            for i in range(0, len(patterns), TEDDY_PATTERNS):
                yield
                group = patterns[i:i + TEDDY_PATTERNS]
                automaton = BytesAhoCorasick(group, matchkind=MATCHKIND_LEFTMOST_FIRST)
                masks = _with_hidden([owners[family, p] for p in group], group)
                gate = family[:1] if family in ("%", "&#") else family
                self._prefilters.append((gate.encode(), automaton, masks))
    def __repr__(self) -> str:
        return f"Redactor(texts={self.texts}, longest={self.longest})"

    def redact(self, data: bytes) -> tuple[bytes, int]:
        """Redact a complete value (a header, a whole body); returns (value, count)."""
        spans = self._spans(data)
        return _replace(data, spans, len(data)), len(spans)

    def stream(self) -> StreamRedactor:
        return StreamRedactor(self)

    def spans(self, data: bytes) -> list[tuple[int, int]]:
        """Non-overlapping (start, end) of every occurrence, left to right."""
        return [(a, b) for a, b, _ in self._spans(data)]

    def _spans(self, data: bytes) -> list[Span]:
        hits: list[tuple[int, int, int]] = []
        escaped = False
        for gate, automaton, masks in self._prefilters:
            if gate == _JSON_GATE:
                if not escaped:
                    continue
            elif gate and gate not in data:
                continue
            matched = [(a, b, masks[i]) for i, a, b in automaton.find_matches_as_indexes(data)]
            if not gate and any(h[2] & _SENTINEL for h in matched):
                escaped = True
                matched = [(a, b, mask & ~_SENTINEL) for a, b, mask in matched if mask & ~_SENTINEL]
            hits += matched
        if not hits:
            return []
        if len(self._prefilters) > 1:
            hits.sort()
        # an occurrence holding the anchor hit [a, b) starts in [a - longest, b): merge such ranges
        window = self.longest
        regions: list[list[int]] = []
        for a, b, mask in hits:
            if regions and a - window <= regions[-1][1]:
                regions[-1][1] = max(regions[-1][1], b)
                regions[-1][2] |= mask
            else:
                regions.append([a, b, mask])
        spans: list[Span] = []
        pos = 0
        for first, high, mask in regions:
            matchers = [m for i, m in enumerate(self._matchers) if mask >> i & 1]
            while pos < high:
                found = self._leftmost_longest(matchers, data, pos, first, high)
                if found is None:
                    break
                spans.append(found)
                pos = found[1]
        return spans

    @staticmethod
    def _leftmost_longest(matchers: list[_Matcher], data: bytes, pos: int, first: int, high: int
                          ) -> Span | None:
        """The leftmost occurrence starting before ``high`` (the longest of those starting at the
        same byte), searching each text only as far as its own longest occurrence reaches."""
        best: Span | None = None
        for matcher in matchers:
            reach = matcher.longest
            stop = min(len(data), high + reach, best[0] + reach if best else len(data))
            m = matcher.full.search(data, max(pos, first - reach), stop)
            if m is None or m.start() >= high:
                continue
            start = m.start()
            if matcher.head:  # plain bytes, compared only after a hit: cheaper than a regex
                stop_at = max(pos, start - len(matcher.head))
                while start > stop_at and data[start - 1] == matcher.head[start - 1 - m.start()]:
                    start -= 1
            if best is None or start < best[0] or (start == best[0] and m.end() > best[1]):
                best = (start, m.end(), matcher.marker)
        return best

    def held_suffix(self, data: bytes) -> int:
        """Length of the longest suffix of ``data`` that could still begin an occurrence."""
        if not self._matchers:
            return 0
        low = max(0, len(data) - self.longest)
        # an occurrence is made of alphabet bytes only: look no further back than the last other
        # byte, and no further back than the first byte one can start with after it
        classes = data[low:].translate(self._classes)
        first = classes.find(1, classes.rfind(2) + 1)
        if first < 0:
            return 0
        # the leftmost start of any text's prefix, each group searched only as far back as its
        # texts' occurrences reach (the longest groups first: each later one starts further on)
        start = low + first
        best = len(data)
        for reach, pattern in self._held:
            lo = max(start, len(data) - reach)
            if lo >= best:
                break
            if (m := pattern.search(data, lo)) is not None:
                best = min(best, m.start())
        return len(data) - best

    def can_grow(self, data: bytes) -> bool:
        """Whether ``data`` followed by one more byte could still begin an occurrence: false for a
        complete one that nothing can extend (the secret itself, a base64 form with its padding)."""
        if any(m.fixed and m.full.fullmatch(data) for m in self._matchers):
            return False
        return any(m.prefix.match(data + bytes((c,))) for c in self.alphabet for m in self._matchers)


def _held_groups(matchers: list[_Matcher]) -> list[tuple[int, list[tuple[bytes, ...]]]]:
    """The texts' prefix patterns for ``held_suffix``, grouped by how far back their occurrences
    reach (within a power of two), longest first: how far back, and the branches of the group's
    alternation. Each branch starts with a literal byte and a check of the byte after it (the
    union over the group's texts that start with that byte), then one text's rest: the search
    skips in C every position no occurrence can start at, and checks the next byte before trying
    any text (an alternation of whole prefix patterns does neither: ~100x slower on a run of a
    letter that starts a text). Spliced from cached pieces (``spliced_regex``), one group a step."""
    groups: dict[int, tuple[list[int], dict[int, tuple[Follow, list[tuple[bytes, ...]]]]]] = {}
    for matcher in matchers:
        reaches, by_byte = groups.setdefault(matcher.longest.bit_length(), ([], {}))
        reaches.append(matcher.longest)
        for byte, follow, after in matcher.leads:
            then, afters = by_byte.get(byte, (frozenset(), []))
            by_byte[byte] = (None if then is None or follow is None else then | follow, [*afters, after])
    return [(max(reaches), [(_lead(byte, then), *after)
                            for byte, (then, afters) in sorted(by_byte.items()) for after in afters])
            for _, (reaches, by_byte) in sorted(groups.items(), reverse=True)]


def _spliced(branches: list[tuple[bytes, ...]]) -> re.Pattern[bytes]:
    return concatenation(branches[0]) if len(branches) == 1 else alternation(branches)


def _lead(byte: int, then: frozenset[int] | None) -> bytes:
    """``byte`` and a check of the byte after it (or the end): one piece, shared by every build."""
    escaped = b"".join(re.escape(bytes((b,))) for b in sorted(then or ()))
    check = b"" if then is None else b"(?=[" + escaped + b"]|\\Z)" if then else b"\\Z"
    return re.escape(bytes((byte,))) + check


def _with_hidden(masks: list[int], patterns: list[bytes]) -> list[int]:
    """A leftmost-first search does not report an anchor that starts inside a reported one, so a
    hit must also stand for the texts of every anchor that could start inside it."""
    starting: dict[int, list[int]] = {}  # first byte -> the patterns starting with it
    for j, other in enumerate(patterns):
        starting.setdefault(other[0], []).append(j)
    out = list(masks)
    for i, hit in enumerate(patterns):
        for k in range(len(hit)):
            for j in starting.get(hit[k], ()):
                other = patterns[j]
                if i != j and (other.startswith(hit[k:]) or hit[k:].startswith(other)):
                    out[i] |= masks[j]
    return out


def _replace(data: bytes, spans: list[Span], cut: int) -> bytes:
    if not spans:
        return data[:cut] if cut < len(data) else data
    out: list[bytes] = []
    pos = 0
    for start, end, marker in spans:
        out += (data[pos:start], marker)
        pos = end
    out.append(data[pos:max(pos, cut)])
    return b"".join(out)


class StreamRedactor:
    """Chunk-by-chunk redaction with a minimal carry-over; ``count`` totals the redactions."""

    def __init__(self, redactor: Redactor) -> None:
        self._r = redactor
        self._carry = b""
        self.count = 0

    def feed(self, chunk: bytes) -> bytes:
        return self._process(self._carry + chunk if self._carry else chunk, final=False)

    def finish(self, last: bytes = b"") -> bytes:
        """The rest of the body, ``last`` its final piece (if any)."""
        return self._process(self._carry + last, final=True)

    def _process(self, data: bytes, final: bool) -> bytes:
        if not data:
            return b""
        boundary = len(data) if final else len(data) - self._r.held_suffix(data)
        # an occurrence starting at or after the boundary may still grow: decide when more arrives
        spans = [s for s in self._r._spans(data) if s[0] < boundary]
        self.count += len(spans)
        cut = max(spans[-1][1], boundary) if spans else boundary
        self._carry = data[cut:]
        return _replace(data, spans, cut)
