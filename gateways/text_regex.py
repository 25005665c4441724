"""The regex that finds one text of a secret (``secret_forms.Text``): each character one unit whose
alternatives start with distinct bytes (a trie), so matching stays linear; a flat prefix pattern
for an occurrence the data may still complete; the anchors the prefilter looks for, folded forms
included."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from gateways.secret_forms import (
    ANCHOR_LENGTH,
    FOLD_ANCHORS,
    FOLD_GAP,
    FOLD_RUN,
    Alternative,
    Anchor,
    Atom,
    Text,
    Unit,
    units_of,
)
from gateways.spliced_regex import Unique

_GAP = rb"(?:[ \t\r\n]|\\[nrt]|%%0[aAdD9]|%%20){0,%d}" % FOLD_GAP
_HEX_GAP = _GAP.replace(b"[ ", b"[: ", 1)  # hex also in colon-separated pairs (fingerprints)
_GAP_BYTES = frozenset(b" \t\r\n\\nrt%0aAdD92:")
_GAP_FIRST = frozenset(b" \t\r\n\\%")  # the bytes a gap can start with
_HEX_GAP_FIRST = _GAP_FIRST | {ord(":")}
_GAP_LONGEST = 3 * FOLD_GAP
# every proper prefix of every way of writing one character: a UTF-8 lead, or an unfinished escape
ANY_PARTIAL = rb"(?:[\x80-\xff]{1,3}|[%&\\][#%0-9A-Za-z\\]{0,40})"
_PARTIAL_FIRST = frozenset(range(0x80, 0x100)).union(b"%&\\")

# a byte a prefix can start with, the bytes that can follow it short of the end (None: any), and
# the regex of the rest of the prefix after it
Follow = frozenset[int] | None
Lead = tuple[int, Follow, tuple[bytes, ...]]


@dataclass(frozen=True)
class Compiled:
    """Regex sources and the facts the matcher needs about one text."""

    # each regex as the pieces it concatenates (one per character: gateways/spliced_regex.py
    # compiles a piece once, whichever secret it is part of)
    full_pieces: tuple[bytes, ...] = field(repr=False)  # a whole occurrence
    prefix_pieces: tuple[bytes, ...] = field(repr=False)  # a nonempty prefix up to the data's end
    leads: tuple[Lead, ...] = field(repr=False)  # ``prefix`` by its first byte (``_leads_of``)
    anchors: frozenset[Anchor] = field(repr=False)  # every occurrence contains one of these
    alphabet: frozenset[int]  # every byte of every occurrence is one of these
    longest: int  # bytes in the longest possible occurrence

    @property
    def full(self) -> bytes:
        return b"".join(self.full_pieces)

    @property
    def prefix(self) -> bytes:
        return b"".join(self.prefix_pieces)


class _Node:
    __slots__ = ("children", "end")

    def __init__(self) -> None:
        self.children: dict[Atom, _Node] = {}
        self.end = False


@functools.lru_cache(maxsize=4096)
def _unit_regex(alternatives: tuple[Alternative, ...]) -> tuple[bytes, bytes]:
    """(whole, any nonempty prefix) regex sources for one unit."""
    node = _trie(alternatives)
    return _full(node), _partial(node)


def _trie(alternatives: tuple[Alternative, ...]) -> _Node:
    root = _Node()
    for alt in alternatives:
        node = root
        for atom in alt:
            node = node.children.setdefault(atom, _Node())
        node.end = True
    return root


def _atom(atom: Atom) -> bytes:
    chars, low, high = atom
    escaped = [re.escape(bytes((b,))) for b in sorted(chars)]
    out = escaped[0] if len(escaped) == 1 else b"[" + b"".join(escaped) + b"]"
    return out if (low, high) == (1, 1) else out + b"{%d,%d}" % (low, high)


def _full(node: _Node) -> bytes:
    parts = [_atom(a) + _full(child) for a, child in node.children.items()]
    if node.end and parts:
        parts.append(b"")  # last: a longer alternative wins over the one it extends
    return parts[0] if len(parts) == 1 else b"(?:" + b"|".join(parts) + b")" if parts else b""


def _partial(node: _Node) -> bytes:
    """Any nonempty prefix of any alternative."""
    parts = [_atom(a) + (b"(?:" + _partial(child) + b")?" if child.children else b"")
             for a, child in node.children.items()]
    return parts[0] if len(parts) == 1 else b"(?:" + b"|".join(parts) + b")"


@functools.lru_cache(maxsize=4096)
def _leads(alternatives: tuple[Alternative, ...]) -> tuple[tuple[int, Follow, bool, bytes], ...]:
    """For each byte a unit can start with: the bytes that can follow it inside the unit (None: any),
    whether the unit can end there, and the regex of the rest of the unit after it — whole, or
    partly with the data ending there."""
    peeled: dict[int, list[Alternative]] = {}
    for (chars, low, high), *rest in alternatives:
        if low < 1:  # secret_forms starts every way of writing a character with a required byte
            raise ValueError("a unit's first atom must be required")
        left: Alternative = ((chars, low - 1, high - 1),) if high > 1 else ()
        for byte in chars:
            peeled.setdefault(byte, []).append(left + tuple(rest))
    out = []
    for byte, alts in sorted(peeled.items()):
        node = _trie(tuple(alts))
        partly = b"(?:" + _partial(node) + b")?" if node.children else b""
        inner = None if any(low == 0 for _, low, _ in node.children) else \
            frozenset(b for chars, _, _ in node.children for b in chars)
        out.append((byte, inner, node.end, b"(?:" + _full(node) + b"|" + partly + b"\\Z)"))
    return tuple(out)


def _union(one: frozenset[int] | None, other: frozenset[int] | None) -> frozenset[int] | None:
    return None if one is None or other is None else one | other


def _leads_of(required: list[Unit], tail: list[Unit], gap: bytes,
              rest: tuple[bytes, ...]) -> tuple[Lead, ...]:
    """The prefix pattern by its first byte (``rest``: the pieces after the first unit). A
    redactor groups every text's prefix by first byte into one alternation whose branches start
    with their literal and check the byte after it: ``re`` then skips in C every position no
    occurrence can start at (a prefix pattern that starts with a group gives it no first byte)."""
    following = (required[1:] + tail)[:1]
    then = _first_bytes(following[0], gap) if following else frozenset()
    return tuple((b, _union(inner, then) if ends else inner, (after, *rest))
                 for b, inner, ends, after in _leads(required[0].alternatives))


def _first_bytes(unit: Unit, gap: bytes) -> frozenset[int] | None:
    """The bytes ``(?:gap(?:unit|ANY_PARTIAL\\Z|\\Z))`` can start with, short of the end (None: any)."""
    if any(low == 0 for (_, low, _), *_ in unit.alternatives):
        return None
    found = _PARTIAL_FIRST.union(*(chars for (chars, _, _), *_ in unit.alternatives))
    return found | (_HEX_GAP_FIRST if gap == _HEX_GAP else _GAP_FIRST if gap else frozenset())


def compile_text(text: Text) -> Compiled:
    required, tail = text.units()
    head = units_of(text.head, "none")  # verbatim: the redactor extends a match back into it
    regexes = [_unit_regex(u.alternatives) for u in required]
    tail_regexes = [_unit_regex(u.alternatives) for u in tail]
    gap = (_HEX_GAP if text.escaped == "none" else _GAP) if text.fold else b""
    optional = b""
    for whole, _ in reversed(tail_regexes):
        optional = b"(?:" + gap + whole + optional + b")?"
    full = [regexes[0][0], *(piece for whole, _ in regexes[1:] for piece in (gap, whole) if piece)]
    full += [Unique(optional)] if optional else []  # this secret's own: not worth caching
    # Flat, not nested (a long secret would nest too deep): each unit matches whole, or partly with
    # the data ending there. Past the first unit "partly" is any escape-like fragment: a superset,
    # which may hold back a few more bytes but never fewer. (A head is not held for: an occurrence
    # that starts in it is caught from its required part on; see docs/redaction.md.)
    prefix = [b"(?:" + regexes[0][0] + b"|" + regexes[0][1] + b"\\Z)"]
    prefix += [b"(?:" + gap + b"(?:" + whole + b"|" + ANY_PARTIAL + b"\\Z|\\Z))"
               for whole, _ in regexes[1:] + tail_regexes]
    alts = [a for u in head + required + tail for a in u.alternatives]
    anchors = {text.anchor}.union(*(u.anchors for u in head + required))
    if text.fold:
        anchors |= _fold_anchors(text.required, spaced=text.name == "hex",
                                 colons=text.name in ("hex", "HEX"))
    units = head + required + tail
    return Compiled(
        full_pieces=tuple(full), prefix_pieces=(*prefix, b"\\Z"), anchors=frozenset(anchors),
        leads=_leads_of(required, tail, gap, (*prefix[1:], b"\\Z")),
        alphabet=frozenset(b for a in alts for atom in a for b in atom[0]).union(
            _GAP_BYTES if text.fold else ()),
        longest=sum(max(sum(atom[2] for atom in a) for a in u.alternatives) for u in units)
        + (_GAP_LONGEST * (len(units) - 1) if text.fold else 0),
    )


def _fold_anchors(required: bytes, spaced: bool, colons: bool) -> set[Anchor]:
    """Verbatim pieces of a foldable text such that every occurrence whose runs between gaps are
    at least ``FOLD_RUN`` long holds one: ``ANCHOR_LENGTH`` bytes every ``FOLD_RUN -
    ANCHOR_LENGTH + 1`` (any run that long holds one whole), the first ``ANCHOR_LENGTH`` (one
    gap near the end), for lower-case hex the text grouped by single spaces in 2s and 4s (the
    dumps of xxd, hexdump, od), and for hex in either case colon-separated pairs (fingerprints).
    Kept few: past 64 always-searched anchors the prefilter slows down."""
    # at most FOLD_ANCHORS per text (a long secret's lines must then be longer: see FOLD_ANCHORS)
    stride = max(FOLD_RUN - ANCHOR_LENGTH + 1, -(-(len(required) - ANCHOR_LENGTH) // (FOLD_ANCHORS - 1)))
    starts = range(0, max(1, len(required) - ANCHOR_LENGTH + 1), stride)
    pieces = {required[i:i + ANCHOR_LENGTH] for i in starts}
    pieces.add(required[:ANCHOR_LENGTH])
    groupings = [(b" ", 2), (b" ", 4)] if spaced else []
    for sep, size in groupings + ([(b":", 2)] if colons else []):
        grouped = sep.join(required[i:i + size] for i in range(0, len(required), size))
        if len(required) > 2 * size:
            pieces.add(grouped[-ANCHOR_LENGTH:])
    return {("", p) for p in pieces}
