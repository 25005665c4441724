"""The one JSON profile valetkey reads: run-token segments and every broker request body.

UTF-8 without a byte-order mark (so no UTF-16/32, which ``json.loads`` would otherwise guess from
bytes), a JSON object at the top, no member name twice in any object at any depth (parsers
disagree on which one wins), no ``NaN``/``Infinity``, no number that is not finite or longer than
``MAX_NUMBER_CHARS``, no lone surrogate escape (``"\\ud800"`` is not a Unicode string), and at most
``MAX_DEPTH`` nested arrays/objects — counted on the text *before* parsing, so a deep document
cannot exhaust the parser's recursion. The caller bounds the size before it calls.

Every refusal is a ``BadRequest`` with reason ``invalid_json``, ``duplicate_member`` or
``json_too_deep``; token verification turns it into ``invalid_token``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, NoReturn

from contract.errors import BadRequest, Reason

MAX_DEPTH = 16  # a run request nests 4 deep, a token payload 4, a revocation 1
MAX_NUMBER_CHARS = 32  # Unix times and TTLs need 10; nobody needs a 4,300-digit integer

# A JSON string (the unrolled form: no backtracking), or an unterminated one up to the end of the
# text: the parser stops there, and a match that could fail would be retried from every later
# quote (quadratic: 64 KiB of '\"' took seconds).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BOM = "\ufeff"


def _refuse(detail: str, reason: Reason = Reason.INVALID_JSON) -> NoReturn:
    raise BadRequest(detail, reason)


def too_deep(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether arrays and objects nest deeper than ``limit``, brackets inside strings not counted.

    Wherever the parser would descend, the strings before it are complete, so this count is
    never below the depth the parser would reach."""
    if text.count("[") + text.count("{") <= limit:  # the usual case, at C speed
        return False
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if len(brackets) <= limit:
        return False
    depth = 0
    for char in brackets:
        depth += 1 if char in "[{" else -1
        if depth > limit:
            return True
    return False


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            _refuse(f"member {key[:40]!r} appears twice in one object", Reason.DUPLICATE_MEMBER)
        out[key] = value
    return out


def _int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        _refuse(f"a number longer than {MAX_NUMBER_CHARS} characters")
    return int(text)


def _float(text: str) -> float:
    value = float(text) if len(text) <= MAX_NUMBER_CHARS else math.inf
    if not math.isfinite(value):
        _refuse(f"a number that is not finite or longer than {MAX_NUMBER_CHARS} characters")
    return value


def _constant(name: str) -> NoReturn:
    _refuse(f"{name} is not JSON")


_DECODER = json.JSONDecoder(object_pairs_hook=_pairs, parse_int=_int, parse_float=_float,
                            parse_constant=_constant)  # built once: json.loads with hooks builds one a call


def parse_object(raw: bytes, what: str = "body") -> dict[str, Any]:
    """``raw`` as a JSON object in the profile above, or ``BadRequest`` naming what is wrong."""
    try:
        text = raw.decode("utf-8")  # strict: overlong forms, encoded surrogates, stray bytes
    except UnicodeDecodeError:
        _refuse(f"{what} is not UTF-8")
    if text.startswith(_BOM):
        _refuse(f"{what} starts with a byte-order mark")
    if too_deep(text):
        _refuse(f"{what} nests deeper than {MAX_DEPTH} levels", Reason.JSON_TOO_DEEP)
    try:
        value = _DECODER.decode(text)
    except BadRequest:
        raise
    except (ValueError, RecursionError):  # RecursionError cannot happen below MAX_DEPTH
        _refuse(f"{what} is not valid JSON")
    if not isinstance(value, dict):
        _refuse(f"{what} is not a JSON object")
    if "\\u" in text:  # only an escape can make a lone surrogate: strict UTF-8 refused the rest
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            _refuse(f"{what} has a string with a lone surrogate escape")
    return value
