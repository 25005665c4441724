"""Properties of the one JSON profile (``contract.strictjson``), the parser itself, no server needed.

The live refusals are in ``test_input.py`` (bodies) and ``test_token_encoding.py`` (tokens).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.errors import BadRequest
from contract.strictjson import MAX_DEPTH, parse_object, too_deep

TEXT = st.text(st.characters(codec="utf-8"), max_size=12)  # brackets, quotes, backslashes included
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-(10**15), 10**15), TEXT,
                   st.floats(allow_nan=False, allow_infinity=False))
VALUE = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(TEXT, inner, max_size=3)),
                     max_leaves=40)


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


@settings(max_examples=200)
@given(value=st.dictionaries(TEXT, VALUE, max_size=4), indent=st.sampled_from([None, 1]),
       ascii_only=st.booleans())
def test_every_json_object_within_bounds_reads_back(value: dict[str, Any], indent: int | None,
                                                    ascii_only: bool) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    if depth(value) > MAX_DEPTH:
        with pytest.raises(BadRequest) as info:
            parse_object(text.encode())
        assert info.value.code == "json_too_deep"
    else:
        assert parse_object(text.encode()) == value


@settings(max_examples=400)
@given(value=VALUE, limit=st.integers(0, 8))
def test_depth_is_counted_like_the_parser_descends(value: Any, limit: int) -> None:
    """Brackets inside strings (escaped quotes too) never count; every real one does."""
    assert too_deep(json.dumps(value), limit) == (depth(value) > limit)


@settings(max_examples=400)
@given(raw=st.one_of(st.binary(max_size=200), TEXT.map(str.encode),
                     st.lists(st.sampled_from(['{"a":', "[", "]", "}", '"\\"', '"', ",", "1", "\\"]),
                              max_size=60).map(lambda parts: "".join(parts).encode())))
def test_anything_else_is_a_bad_request(raw: bytes) -> None:
    outcome: Any
    try:
        outcome = parse_object(raw)
    except BadRequest as exc:
        outcome = exc.code
    assert isinstance(outcome, dict) or outcome in {"invalid_json", "duplicate_member", "json_too_deep"}


@pytest.mark.parametrize(("raw", "code"), [
    pytest.param(b"[" * 100_000, "json_too_deep", id="deep-arrays-unclosed"),
    pytest.param(b'{"a":' * 20_000 + b"1" + b"}" * 20_000, "json_too_deep", id="deep-objects"),
    pytest.param(b'{"a":"' + b"\\" * 10_001 + b'"}', "invalid_json", id="odd-backslashes"),
    pytest.param(b'{"a":"\\' + b'"' * 5000 + b"}", "invalid_json", id="escaped-quotes"),
    pytest.param(b'"' + b'\\"' * 30_000, "invalid_json", id="unterminated-escaped-quotes"),
    pytest.param(b'"' + b'\\"' * 30_000 + b"\\", "invalid_json", id="unterminated-trailing-backslash"),
    pytest.param(b'{"a":1,"b":{"c":2,"c":3}}', "duplicate_member", id="duplicate-at-depth-2"),
    pytest.param(b'{"\\u00e9":1,"\xc3\xa9":2}', "duplicate_member", id="duplicate-escaped-and-raw"),
    pytest.param(b'{"a":"\\udfff\\ud800"}', "invalid_json", id="reversed-pair"),
    pytest.param(b'{"a":1.' + b"0" * 40 + b"}", "invalid_json", id="long-fraction"),
    pytest.param(b'{"a":-0}', None, id="minus-zero-is-json"),
    pytest.param(b'{"a":"\\ud83d\\ude00"}', None, id="escaped-pair-is-json"),
    pytest.param(b' \t\r\n{"a":[]} \n', None, id="json-whitespace"),
])
def test_edges(raw: bytes, code: str | None) -> None:
    if code is None:
        assert isinstance(parse_object(raw), dict)
        return
    with pytest.raises(BadRequest) as info:
        parse_object(raw)
    assert info.value.code == code


def _seconds(raw: bytes) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        with pytest.raises(BadRequest):
            parse_object(raw)
        best = min(best, time.perf_counter() - start)
    return best


@pytest.mark.parametrize("unit", [
    pytest.param(b'\\"', id="escaped-quotes"),
    pytest.param(b'"[', id="quote-bracket"),
    pytest.param(b'{"a":', id="objects"),
])
def test_refusal_cost_is_linear_in_size(unit: bytes) -> None:
    """Ten times the text costs about ten times the time, not a hundred (a retried match did)."""
    small, large = b'"' + unit * 3_000, b'"' + unit * 30_000
    assert _seconds(large) < 40 * max(_seconds(small), 1e-5)
