"""Regexes assembled from pieces whose compiled code is cached, so learning a new secret costs
milliseconds, not the ~0.5 s of CPU that ``re.compile`` spends on its patterns.

A secret's patterns (``gateways/text_regex.py``) are long concatenations of small pieces — one
per character of the text, each listing every way that character may be written — and the same
character always gives the same piece. ``re.compile`` parses and compiles the whole pattern in
pure Python (holding the GIL: a build in a thread still stalls the event loop), although a
concatenation compiles to the concatenation of its pieces' code: the regex engine's jumps are
relative. So each distinct piece is parsed and compiled once (``functools.lru_cache``), and a
pattern is its pieces' code joined, with the same optimisation header (``INFO``) ``re`` would
write, handed to ``_sre.compile`` — the engine, matching semantics and speed are those of
``re.compile`` of the joined source.

This uses the ``re`` package's private compiler (``re._parser``, ``re._compiler``), whose code
format belongs to the running Python. ``SPLICING`` is decided at import by splicing sample
patterns and comparing the code with what ``re`` itself compiles for them: if the running Python
compiles them differently, every pattern is compiled by ``re.compile`` instead (correct, slower).
"""

from __future__ import annotations

import _sre  # type: ignore[import-not-found]
import functools
import re
from collections.abc import Sequence
from typing import Any

try:  # private: their absence or another code format turns splicing off (see SPLICING)
    from re import _compiler, _parser  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - a Python without these modules
    _compiler = _parser = None

__all__ = ["SPLICING", "Unique", "alternation", "concatenation"]

Piece = tuple[list[int], list[Any]]  # a piece's code (no header, no SUCCESS) and its parsed items


class Unique(bytes):
    """A piece of one secret only (a text's optional tail): compiled, never cached."""


@functools.lru_cache(maxsize=4096)  # the per-character pieces: a few hundred, shared by every secret
def _shared_piece(source: bytes) -> Piece:
    return _compile_piece(source)


def _piece(source: bytes) -> Piece:
    return _compile_piece(source) if isinstance(source, Unique) else _shared_piece(source)


def _compile_piece(source: bytes) -> Piece:
    parsed = _parser.parse(source, 0)
    if parsed.state.groups != 1:
        raise ValueError("a spliced piece has no capturing group")
    code: list[int] = []
    _compiler._compile(code, parsed.data, 0)
    # one group item per piece: its width, which the INFO header needs, is then computed once
    return code, [(_compiler.SUBPATTERN, (None, 0, 0, parsed))]


def _finish(source: bytes, body: list[int], items: list[Any]) -> re.Pattern[bytes]:
    pattern: re.Pattern[bytes] = _sre.compile(source, 0, _code_of(body, items), 0, {}, (None,))
    return pattern


@functools.lru_cache(maxsize=128)  # a build splices its texts' prefixes again into the alternation
def _concatenation(pieces: tuple[bytes, ...]) -> tuple[list[int], list[Any]]:
    """The pieces' code joined, and their parsed items (read only: the lists are shared)."""
    body: list[int] = []
    items: list[Any] = []
    for source in pieces:
        code, parsed = _piece(source)
        body += code
        items += parsed
    return body, items


def concatenation(pieces: Sequence[bytes]) -> re.Pattern[bytes]:
    """``re.compile(b"".join(pieces))``; each piece a whole regex without capturing groups."""
    if not SPLICING:
        return re.compile(b"".join(pieces))
    return _finish(b"".join(pieces), *_concatenation(tuple(pieces)))


def alternation(patterns: Sequence[Sequence[bytes]]) -> re.Pattern[bytes]:
    """``re.compile(b"|".join(b"(?:" + b"".join(p) + b")" for p in patterns))``: the leftmost
    alternative that matches wins, as in ``re``."""
    source = _alternation_source(patterns)
    if not SPLICING or len(patterns) < 2:
        return re.compile(source)
    return _finish(source, *_branch(patterns))


def _alternation_source(patterns: Sequence[Sequence[bytes]]) -> bytes:
    return b"|".join(b"(?:" + b"".join(p) + b")" for p in patterns)


def _branch(patterns: Sequence[Sequence[bytes]]) -> tuple[list[int], list[Any]]:
    """BRANCH, then per alternative: the offset of the next, its code, a JUMP past the last;
    FAILURE closes it (as ``re._compiler`` writes an alternation)."""
    body: list[int] = [_compiler.BRANCH]
    jumps: list[int] = []
    branches = []
    for pieces in patterns:
        code, items = _concatenation(tuple(pieces))
        skip = len(body)
        body += [0, *code, _compiler.JUMP, 0]
        jumps.append(len(body) - 1)
        body[skip] = len(body) - skip
        branches.append(_parser.SubPattern(_parser.State(), items))
    body.append(_compiler.FAILURE)
    for jump in jumps:
        body[jump] = len(body) - jump
    return body, [(_compiler.BRANCH, (None, branches))]


def _code_of(body: list[int], items: list[Any]) -> list[int]:
    info: list[int] = []
    _compiler._compile_info(info, _parser.SubPattern(_parser.State(), items), 0)
    return [*info, *body, _compiler.SUCCESS]


def _splices_as_re_compiles() -> bool:
    """Do spliced samples compile to exactly the code ``re`` compiles for their sources?"""
    if _compiler is None:
        return False
    pieces = [rb"(?:a|%61|\\u0061)", rb"(?:[ \t]|%0[aA]){0,8}", rb"(?:b[cd]{0,3}|&#0{0,3}98;)",
              rb"(?:-(?:x|%2[dD])?)?", rb"\Z"]
    others = [rb"(?:q|%71)", rb"z+\Z"]
    try:
        for source, spliced in ((b"".join(pieces), _concatenation(tuple(pieces))),
                                (_alternation_source([pieces, others]), _branch([pieces, others]))):
            if _code_of(*spliced) != _compiler._code(_parser.parse(source, 0), 0):
                return False
            _finish(source, *spliced)  # the engine's own check of the code
        return True
    except Exception:  # any change in the private API: fall back to re.compile
        return False


SPLICING = False
SPLICING = _splices_as_re_compiles()
