"""A run token has one spelling and one JSON profile.

Every token here is signed by the real issuer key (Vault transit in the session's OpenBao) or is a
genuine token re-spelled, and must be refused with ``invalid_token`` and the step that refused it:
``encoding`` (base64url that is not canonical), ``json`` (not UTF-8 JSON in the profile of
``contract.strictjson``), ``format``, or ``signature``.
"""

from __future__ import annotations

import base64
import json
import string
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.claims import b64url, b64url_decode
from contract.errors import TokenInvalid
from contract.strictjson import MAX_DEPTH
from tests.contract.test_verify import SLACK, _fresh, _sign
from tests.support.broker_stack import Broker

ALPHABET = string.ascii_uppercase + string.ascii_lowercase + string.digits + "-_"
ED25519_ORDER = 2**252 + 27742317777372353535851937790883648493
Encode = Callable[[dict[str, Any], dict[str, Any]], tuple[bytes, bytes]]


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _header(change: Callable[[dict[str, Any]], bytes]) -> Encode:
    return lambda header, claims: (change(header), _json(claims))


def _payload(change: Callable[[dict[str, Any]], bytes]) -> Encode:
    return lambda header, claims: (_json(header), change(claims))


def _with(raw: bytes, drop: str = "") -> Callable[[dict[str, Any]], bytes]:
    """The object's JSON with ``raw`` spliced in as its last member (``drop`` removed first)."""
    return lambda obj: _json({k: v for k, v in obj.items() if k != drop})[:-1] + b"," + raw + b"}"


def _text(**claims: Any) -> Callable[[dict[str, Any]], bytes]:
    """The object's JSON with claims replaced, whose text is then byte-substituted."""
    return lambda obj: _json({**obj, **claims})


def _bytes_in_client_id(raw: bytes) -> Callable[[dict[str, Any]], bytes]:
    return lambda obj: _json({**obj, "client_id": "@@"}).replace(b"@@", raw)


def _encoded(codec: str) -> Callable[[dict[str, Any]], bytes]:
    return lambda obj: _json(obj).decode().encode(codec)


JSON_PROFILE = [
    # not UTF-8, or UTF-8 with a byte-order mark: json.loads would have guessed the encoding
    *[pytest.param(_header(_encoded(codec)), id=f"header-{codec}")
      for codec in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be", "utf-8-sig")],
    *[pytest.param(_payload(_encoded(codec)), id=f"payload-{codec}")
      for codec in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be", "utf-8-sig")],
    pytest.param(_payload(_bytes_in_client_id(b"\xc0\xae")), id="overlong-utf8"),
    pytest.param(_payload(_bytes_in_client_id(b"\xe0\x80\xae")), id="overlong-utf8-3-bytes"),
    pytest.param(_payload(_bytes_in_client_id(b"\xff")), id="invalid-utf8-byte"),
    pytest.param(_payload(_bytes_in_client_id(b"\xed\xa0\x80")), id="utf8-encoded-surrogate"),
    pytest.param(_payload(_bytes_in_client_id(b"\xf4\x90\x80\x80")), id="utf8-above-u10ffff"),
    pytest.param(_payload(_bytes_in_client_id(b"a\x01b")), id="control-character-in-string"),
    # escapes that do not make a Unicode string
    pytest.param(_payload(_text(jti="\ud800")), id="lone-high-surrogate-escape"),
    pytest.param(_payload(_text(jti="x\udc00")), id="lone-low-surrogate-escape"),
    pytest.param(_payload(_text(jti="\udc00\ud800")), id="reversed-surrogate-pair"),
    pytest.param(_payload(_text(grants=[{"purpose": "post_message", "params": {"\ud800": "x"}}])),
                 id="lone-surrogate-in-member-name"),
    # numbers JSON has not, or no one needs
    pytest.param(_payload(_with(b'"exp":NaN', drop="exp")), id="nan"),
    pytest.param(_payload(_with(b'"exp":Infinity', drop="exp")), id="infinity"),
    pytest.param(_payload(_with(b'"exp":-Infinity', drop="exp")), id="minus-infinity"),
    pytest.param(_payload(_with(b'"exp":1' + b"0" * 40, drop="exp")), id="huge-integer"),
    pytest.param(_payload(_with(b'"exp":1e999', drop="exp")), id="float-overflows-to-infinity"),
    pytest.param(_payload(_with(b'"x":0.' + b"0" * 40 + b"1")), id="long-float"),
    # duplicate member names, at any depth, however spelled
    pytest.param(_payload(_with(b'"aud":"github"')), id="duplicate-claim"),
    pytest.param(_payload(_with(b'"a\\u0075d":"github"')), id="duplicate-claim-escaped-name"),
    pytest.param(_payload(_with(b'"grants":[{"purpose":"post_message","params":{},"params":{}}]',
                                drop="grants")), id="duplicate-in-grant"),
    pytest.param(_payload(_with(b'"x":[{"y":{"a":1,"a":2}}]')), id="duplicate-at-depth-4"),
    pytest.param(_header(_with(b'"kid":"valetkey-tokens:v99"')), id="duplicate-header-kid"),
    # depth, bounded before parsing
    pytest.param(_payload(_with(b'"x":' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))),
                 id="nested-past-max-depth"),
    pytest.param(_payload(_with(b'"x":' + b'{"a":' * 300 + b"1" + b"}" * 300)), id="nested-300-objects"),
    # not one JSON object
    *[pytest.param(_payload(lambda _, raw=raw: raw), id=f"payload-{label}")
      for label, raw in [("array", b"[]"), ("string", b'"x"'), ("null", b"null"), ("number", b"1"),
                         ("true", b"true")]],
    pytest.param(_header(lambda _: b"[]"), id="header-array"),
    pytest.param(_payload(lambda c: _json(c) + b"x"), id="trailing-garbage"),
    pytest.param(_payload(lambda c: _json(c) + _json(c)), id="two-objects"),
    pytest.param(_payload(lambda c: _json(c) + b"\x00"), id="trailing-nul"),
    pytest.param(_payload(lambda c: b"\x0c" + _json(c)), id="form-feed-is-not-json-whitespace"),
    pytest.param(_payload(lambda c: b"/**/" + _json(c)), id="comment"),
    pytest.param(_payload(lambda c: _json(c)[:-1] + b",}"), id="trailing-comma"),
    pytest.param(_payload(lambda c: _json(c).replace(b'"', b"'")), id="single-quotes"),
]


@pytest.mark.anyio
@pytest.mark.parametrize("encode", JSON_PROFILE)
async def test_json_outside_the_profile_is_refused(broker: Broker, encode: Encode) -> None:
    header, claims, _ = await _fresh(broker)
    head, body = encode(header, claims)
    token = await _sign(broker, b64url(head), b64url(body))
    async with broker.verifier("slack") as verifier:
        with pytest.raises(TokenInvalid) as info:
            await verifier.verify(token)
    assert (info.value.code, info.value.check) == ("invalid_token", "json"), info.value.detail
    assert token not in repr(info.value)


ACCEPTED = [
    pytest.param(_payload(_text(jti="\U0001f600 \u00e9")), id="escaped-surrogate-pair-and-latin1"),
    pytest.param(_payload(lambda c: json.dumps(c, ensure_ascii=False, indent=1).encode() + b" \r\n\t"),
                 id="whitespace"),
    pytest.param(_payload(lambda c: _json(dict(reversed(list(c.items()))))), id="member-order"),
    pytest.param(_payload(_with(b'"x":' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1))),
                 id="nested-to-max-depth"),
    pytest.param(_payload(_with(b'"x":"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\"{{{{{{{{{{{{{{{{{{{"')),
                 id="brackets-in-a-string"),
]


@pytest.mark.anyio
@pytest.mark.parametrize("encode", ACCEPTED)
async def test_json_inside_the_profile_is_accepted(broker: Broker, encode: Encode) -> None:
    """The profile is strict about encoding, not about spelling JSON the issuer signed."""
    header, claims, _ = await _fresh(broker)
    head, body = encode(header, claims)
    token = await _sign(broker, b64url(head), b64url(body))
    async with broker.verifier("slack") as verifier:
        verified = await verifier.verify(token)
    assert verified.run_id == claims["sub"]


def _dirty_tail(segment: str, low_bits: int = 1) -> str:
    """The same bytes with non-zero trailing bits: what a lenient decoder reads as ``segment``."""
    bits = {2: 4, 3: 2}[len(segment) % 4]
    index = ALPHABET.index(segment[-1])
    return segment[:-1] + ALPHABET[index | (low_bits % (1 << bits) or 1)]


def _padded_json(value: dict[str, Any]) -> bytes:
    """JSON whose base64url has trailing bits (trailing whitespace is still the same JSON)."""
    raw = _json(value)
    return raw + b" " * ((1 - len(raw)) % 3)


async def _signed_noncanonical(broker: Broker, which: str) -> str:
    header, claims, _ = await _fresh(broker)
    head, body = b64url(_padded_json(header)), b64url(_padded_json(claims))
    if which == "header":
        head = _dirty_tail(head)
    else:
        body = _dirty_tail(body)
    return await _sign(broker, head, body)  # the issuer signed exactly this text


def _respelled(kind: str) -> Callable[[str], str]:
    def apply(token: str) -> str:
        head, body, sig = token.split(".")
        raw_sig = base64.urlsafe_b64decode(sig + "==")
        if kind == "signature-trailing-bits":
            return f"{head}.{body}.{_dirty_tail(sig)}"
        if kind == "signature-padded":
            return f"{head}.{body}.{sig}=="
        if kind == "signature-standard-alphabet":
            return f"{head}.{body}.{sig.replace('-', '+').replace('_', '/')}"
        if kind == "signature-whitespace":
            return f"{head}.{body}.{sig[:40]}\n{sig[40:]}"
        if kind == "signature-length-1-mod-4":
            return f"{head}.{body}.{sig}AAA"
        if kind == "signature-s-plus-group-order":
            s = int.from_bytes(raw_sig[32:], "little") + ED25519_ORDER
            return f"{head}.{body}.{b64url(raw_sig[:32] + s.to_bytes(32, 'little'))}"
        if kind == "signature-65-bytes":
            return f"{head}.{body}.{b64url(raw_sig + bytes(1))}"
        if kind == "signature-63-bytes":
            return f"{head}.{body}.{b64url(raw_sig[:63])}"
        if kind == "empty-signature":
            return f"{head}.{body}."
        raise AssertionError(kind)
    return apply


RESPELLED = [
    pytest.param(_respelled("signature-trailing-bits"), "encoding", id="signature-trailing-bits"),
    pytest.param(_respelled("signature-length-1-mod-4"), "encoding", id="signature-length-1-mod-4"),
    pytest.param(_respelled("signature-padded"), "format", id="signature-padded"),
    pytest.param(_respelled("signature-standard-alphabet"), "format", id="signature-standard-alphabet"),
    pytest.param(_respelled("signature-whitespace"), "format", id="signature-whitespace"),
    pytest.param(_respelled("empty-signature"), "format", id="empty-signature"),
    # Ed25519's own malleability: S + L verifies in lenient implementations; OpenSSL refuses it
    pytest.param(_respelled("signature-s-plus-group-order"), "signature", id="signature-s-plus-order"),
    pytest.param(_respelled("signature-65-bytes"), "signature", id="signature-65-bytes"),
    pytest.param(_respelled("signature-63-bytes"), "signature", id="signature-63-bytes"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("respell", "check"), RESPELLED)
async def test_respelled_genuine_token_is_refused(
    broker: Broker, respell: Callable[[str], str], check: str
) -> None:
    for _ in range(50):  # a signature without '-' or '_' has no standard-alphabet spelling: mint another
        _, _, genuine = await _fresh(broker)
        token = respell(genuine)
        if token != genuine:
            break
    assert token != genuine
    async with broker.verifier("slack") as verifier:
        await verifier.verify(genuine)
        with pytest.raises(TokenInvalid) as info:
            await verifier.verify(token)
    assert (info.value.code, info.value.check) == ("invalid_token", check), info.value.detail


@pytest.mark.anyio
@pytest.mark.parametrize("which", ["header", "payload"])
async def test_signed_noncanonical_segment_is_refused(broker: Broker, which: str) -> None:
    """Even when the issuer itself signed the non-canonical text."""
    token = await _signed_noncanonical(broker, which)
    async with broker.verifier("slack") as verifier:
        with pytest.raises(TokenInvalid) as info:
            await verifier.verify(token)
    assert (info.value.code, info.value.check) == ("invalid_token", "encoding")


Change = tuple[str, int, str]  # (kind, a number for it, whitespace for it)
CHANGES = st.tuples(st.sampled_from(["same", "padding", "whitespace", "trailing-bits", "standard-alphabet"]),
                    st.integers(0, 10_000), st.sampled_from([" ", "\n", "\r\n", "\t", "\x0b"]))


def _respell_segment(segment: str, change: Change) -> str:
    """Another text for the same bytes, as a lenient base64 decoder would read it."""
    kind, number, space = change
    if kind == "trailing-bits" and len(segment) % 4 in (2, 3):
        return _dirty_tail(segment, number % 15 + 1)
    if kind == "standard-alphabet" and ("-" in segment or "_" in segment):
        return segment.replace("-", "+").replace("_", "/")
    if kind == "padding":
        return segment + "=" * (number % 3 + 1)
    if kind != "same":  # whitespace, and the kinds this segment cannot take
        at = number % (len(segment) + 1)
        return segment[:at] + space + segment[at:]
    return segment


def respell(token: str, changes: tuple[Change, Change, Change]) -> str:
    segments = [_respell_segment(s, c) for s, c in zip(token.split("."), changes, strict=True)]
    if segments == token.split("."):  # nothing changed: re-spell the signature's tail
        segments[2] = _dirty_tail(segments[2])
    return ".".join(segments)


@pytest.fixture(scope="module")
def genuine(broker: Broker) -> str:
    token: str = broker.mint("notifier", [SLACK]).json()["env"]["SLACK_BOT_TOKEN"]
    return token


@pytest.mark.anyio
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.tuples(CHANGES, CHANGES, CHANGES))
async def test_any_other_spelling_of_a_valid_token_is_refused(
    broker: Broker, genuine: str, changes: tuple[Change, Change, Change]
) -> None:
    token = respell(genuine, changes)
    assert token != genuine
    async with broker.verifier("slack") as verifier:
        with pytest.raises(TokenInvalid) as info:
            await verifier.verify(token)
    assert info.value.code == "invalid_token"
    assert info.value.check in {"format", "encoding"}


@settings(max_examples=500, deadline=None)
@given(raw=st.binary(min_size=1, max_size=200), change=CHANGES)
def test_base64url_has_one_spelling(raw: bytes, change: Change) -> None:
    """``b64url_decode`` reads what ``b64url`` writes, and refuses every other spelling of it."""
    canonical = b64url(raw)
    assert b64url_decode(canonical) == raw
    other = _respell_segment(canonical, change)
    if other == canonical:
        return
    assert base64.b64decode(other.replace("-", "+").replace("_", "/") + "==") == raw  # lenient
    with pytest.raises(ValueError, match="base64url"):
        b64url_decode(other)
