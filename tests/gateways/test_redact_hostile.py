"""The redactor against the hostile classes of issue #11, on tables and properties: secrets split
across server-sent events (gateways/sse.py), folded base64/hex, UTF-16/32 text, partial echoes."""

from __future__ import annotations

import base64
import itertools
import json
import string

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from contract.errors import Reason, UpstreamError
from gateways.redact import MARKER, Redactor
from gateways.secret_forms import FOLD_RUN, PARTIAL_LENGTH, public_prefix
from gateways.sse import MAX_EVENT_BYTES, MAX_HELD_EVENTS, SseRedactor, body_stream
from tests.support.leaks import HOSTILE, joined, revealed, split_events

SECRET = "real-echo-secret-9f08c7073438643749a812e4"
PROVIDER = "sk-proj-Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0LmNb"
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])


@pytest.fixture(scope="module")
def redactor() -> Redactor:
    return Redactor([SECRET.encode(), PROVIDER.encode()], [b"Bearer " + SECRET.encode()])


def through_sse(redactor: Redactor, events: list[bytes], cuts: list[int] = ()) -> tuple[list[bytes], int]:  # type: ignore[assignment]
    """Feed the events (re-cut at ``cuts`` if given); what came out after each feed, and the count."""
    stream = SseRedactor(redactor)
    body = b"".join(events)
    points = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)}) if cuts else None
    pieces = [body[a:b] for a, b in itertools.pairwise(points)] if points else events
    out = [stream.feed(p) for p in pieces]
    return [*out, stream.finish()], stream.count


@pytest.mark.parametrize("form", [pytest.param(n, id=n) for n in HOSTILE])
def test_hostile_forms_reveal_nothing(redactor: Redactor, form: str) -> None:
    # ``revealed`` looks for 8-character prefixes: for a provider key that is its public prefix
    for value in (SECRET,) if form.startswith("prefix-") else (SECRET, PROVIDER):
        body = b'{"detail": "' + HOSTILE[form](value) + b'"}'
        out, count = redactor.redact(body)
        assert count >= 1
        assert revealed(value, out) == []


@pytest.mark.parametrize(("value", "expected"), [
    pytest.param("API key sk-proj-Zx9Qw8E****", "API key sk-proj-Zx9Qw8E****", id="7-past-prefix-kept"),
    pytest.param("API key sk-proj-Zx9Qw8Er****", "API key sk-proj-[R]****", id="8-past-prefix"),
    pytest.param("API key sk-proj-Zx9Qw8Er7Ty6***", "API key sk-proj-[R]***", id="12-past-prefix"),
    pytest.param("key ...Gh1Jk0LmNb", "key ...[R]", id="suffix-10"),
    pytest.param("key ...k0LmNb", "key ...k0LmNb", id="suffix-6-kept"),
    pytest.param("sk-proj-", "sk-proj-", id="public-prefix-alone-kept"),
    pytest.param("real-ech", "[R]", id="no-public-prefix-8"),
])
def test_partial_echoes(redactor: Redactor, value: str, expected: str) -> None:
    out, _ = redactor.redact(value.encode())
    assert out == expected.replace("[R]", MARKER.decode()).encode()


def test_public_prefix_is_the_longest_known() -> None:
    assert public_prefix(b"sk-ant-api03-abc") == b"sk-ant-api03-"
    assert public_prefix(PROVIDER.encode()) == b"sk-proj-"
    assert public_prefix(SECRET.encode()) == b""
    assert PARTIAL_LENGTH == 8


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be", "utf-16", "utf-32-le", "utf-32-be", "utf-32"])
@pytest.mark.parametrize("value", [SECRET, "clé-secrète-€-中文-😀-0123456789"])
def test_wide_text_marker_in_the_body_encoding(codec: str, value: str) -> None:
    redactor = Redactor([value.encode()])
    body = f'{{"error": "bad key {value}", "n": 1}}'.encode(codec)
    out, count = redactor.redact(body)
    assert count == 1
    assert out.decode(codec) == '{"error": "bad key [REDACTED:valetkey]", "n": 1}'


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("lead", [b"", b"x-access-token:", b"ab"])
def test_base64_in_utf16(redactor: Redactor, codec: str, lead: bytes) -> None:
    blob = base64.b64encode(lead + SECRET.encode()).decode()
    out, count = redactor.redact(f'{{"auth": "Basic {blob}"}}'.encode(codec))
    assert count == 1
    assert out.decode(codec).endswith('[REDACTED:valetkey]"}')
    assert revealed(SECRET, out) == []


@pytest.mark.parametrize(("width", "sep"), [(76, b"\r\n"), (64, b"\n"), (FOLD_RUN, b" "), (40, b"\\n"),
                                            (32, b"%0D%0A"), (57, b"\r\n\t")])
@pytest.mark.parametrize("lead", [0, 1, 2, 5, 33])
def test_folded_base64_every_width(redactor: Redactor, width: int, sep: bytes, lead: int) -> None:
    blob = base64.b64encode(bytes(range(lead)) + SECRET.encode() + b"tail-bytes")
    folded = sep.join(blob[i:i + width] for i in range(0, len(blob), width))
    for offset in range(width):  # the secret at every position relative to the line breaks
        shifted = base64.b64encode(bytes(offset % 3) + bytes(range(lead)) + SECRET.encode())
        body = sep.join(shifted[i:i + width] for i in range(0, len(shifted), width)) if offset else folded
        out, count = redactor.redact(b"<" + body + b">")
        assert count >= 1
        assert revealed(SECRET, out) == []


@pytest.mark.parametrize("style", ["raw", "crlf", "openai", "anthropic"])
@pytest.mark.parametrize("parts", [1, 2, 3, 7, len(SECRET)])
def test_sse_split_reveals_nothing_and_keeps_the_rest(redactor: Redactor, style: str, parts: int) -> None:
    out, count = through_sse(redactor, split_events(SECRET.encode(), style, parts))
    events, data, text = joined(b"".join(out))
    assert count >= 1
    assert all(revealed(SECRET, e) == [] for e in events)
    assert revealed(SECRET, data.encode()) == revealed(SECRET, text.encode()) == []
    view = text if style in ("openai", "anthropic") else data
    assert view.replace(" ", "") in ("Thekeyis:[REDACTED:valetkey](end)", "Thekeyis:[REDACTED:valetkey](end)[DONE]")


@pytest.mark.parametrize("event", [
    pytest.param(b"data: hello world\n\n", id="plain"),
    pytest.param(b'data: {"choices": [{"delta": {"content": "Hello."}}]}\n\n', id="openai-delta"),
    pytest.param(b"event: ping\ndata: {}\n\n", id="ping"),
    pytest.param(b": comment\n\n", id="comment"),
    pytest.param(("data: " + SECRET + "\n\n").encode(), id="whole-secret-at-the-end"),
])
def test_event_without_a_pending_match_goes_at_once(redactor: Redactor, event: bytes) -> None:
    stream = SseRedactor(redactor)
    out = stream.feed(event)
    assert out.endswith(b"\n\n")
    assert SECRET.encode() not in out


def test_event_that_could_begin_the_secret_waits_for_the_next() -> None:
    redactor = Redactor([SECRET.encode()])
    stream = SseRedactor(redactor)
    assert stream.feed(b"data: key real-echo-se\n\n") == b""
    # joined, "real-echo-se" is no longer the start of the whole secret: a partial echo (8+)
    assert stream.feed(b"data: nothing else.\n\n") == b"data: key " + MARKER + b"\n\ndata: nothing else.\n\n"
    assert stream.count == 1


@pytest.mark.parametrize("content_type", [b"application/x-ndjson", b"application/jsonl; charset=utf-8",
                                          b"text/event-stream; charset=utf-8"])
def test_streamed_types_are_joined(redactor: Redactor, content_type: bytes) -> None:
    stream = body_stream(redactor, [(b"Content-Type", content_type)])
    assert isinstance(stream, SseRedactor)
    style = "ndjson" if b"json" in content_type else "openai"
    out = b"".join(stream.feed(e) for e in split_events(SECRET.encode(), style, 9)) + stream.finish()
    assert SECRET[:PARTIAL_LENGTH].encode() not in out
    assert MARKER in out


def test_held_events_are_bounded_fail_closed() -> None:
    """A prefix held past the bound is redacted as if it were the secret, and the events go."""
    redactor = Redactor([SECRET.encode()])
    stream = SseRedactor(redactor)
    assert stream.feed(b'data: {"t": "real-echo-secret-9f"}\n\n') == b""
    out = b"".join(stream.feed(b"event: ping\ndata: {}\n\n") for _ in range(MAX_HELD_EVENTS + 1))
    assert out.startswith(b'data: {"t": "' + MARKER + b'"}')
    assert b"real-echo" not in out


def test_oversized_event_cuts_the_stream() -> None:
    stream = SseRedactor(Redactor([SECRET.encode()]))
    with pytest.raises(UpstreamError) as caught:
        stream.feed(b"data: " + b"x" * MAX_EVENT_BYTES)
    assert caught.value.code == Reason.SSE_EVENT_TOO_LARGE.value
    assert SECRET not in str(caught.value)


TEXT = string.ascii_letters + string.digits + " .,:"
secrets = st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=12, max_size=40)


@SETTINGS
@given(secret=secrets, style=st.sampled_from(["raw", "crlf", "openai", "anthropic"]),
       parts=st.integers(1, 12), before=st.text(TEXT, max_size=20), cuts=st.lists(st.integers(0, 10**6), max_size=8))
def test_sse_property_no_event_and_no_join_reveals(secret: str, style: str, parts: int, before: str,
                                                   cuts: list[int]) -> None:
    """Any secret, split into any number of events of any style, the bytes re-cut anywhere."""
    redactor = Redactor([secret.encode()])
    form = (before + secret).encode()
    out, count = through_sse(redactor, split_events(form, style, parts), cuts)
    events, data, text = joined(b"".join(out))
    assert count >= 1
    for view in [*events, data.encode(), text.encode()]:
        assert secret.encode() not in view
        assert secret[:PARTIAL_LENGTH].encode() not in view.replace(MARKER, b"|")


@SETTINGS
@given(secret=secrets, codec=st.sampled_from(["utf-16-le", "utf-16-be", "utf-16", "utf-32-le", "utf-32-be"]),
       before=st.text(TEXT, max_size=30), after=st.text(TEXT, max_size=30), chunk=st.integers(1, 64))
def test_wide_property_stream_decodes_to_the_marker(secret: str, codec: str, before: str, after: str,
                                                    chunk: int) -> None:
    redactor = Redactor([secret.encode()])
    body = (before + secret + after).encode(codec)
    stream = redactor.stream()
    out = b"".join(stream.feed(body[i:i + chunk]) for i in range(0, len(body), chunk)) + stream.finish()
    assert secret not in out.decode(codec, "replace")
    assert "[REDACTED:valetkey]" in out.decode(codec, "replace")


@SETTINGS
@given(secret=st.binary(min_size=8, max_size=48), lead=st.binary(max_size=5), width=st.integers(FOLD_RUN, 100),
       sep=st.sampled_from([b"\n", b"\r\n", b" ", b"\\n", b"\r\n  "]), chunk=st.integers(1, 200))
def test_fold_property_base64_and_hex(secret: bytes, lead: bytes, width: int, sep: bytes, chunk: int) -> None:
    redactor = Redactor([secret])
    for blob in (base64.b64encode(lead + secret + b"~~~~"), (lead + secret).hex().encode()):
        body = b"{" + sep.join(blob[i:i + width] for i in range(0, len(blob), width)) + b"}"
        stream = redactor.stream()
        out = b"".join(stream.feed(body[i:i + chunk]) for i in range(0, len(body), chunk)) + stream.finish()
        flat = out.replace(b"\\n", b"").translate(None, b" \r\n")
        assert secret.hex().encode() not in flat
        for k in range(3):
            determined = base64.b64encode(bytes(k) + secret)[-(-8 * k // 6):8 * (k + len(secret)) // 6]
            assert determined not in flat


@SETTINGS
@given(secret=secrets, keep=st.integers(PARTIAL_LENGTH, 40), end=st.booleans(), around=st.text(TEXT, max_size=20))
def test_partial_property(secret: str, keep: int, end: bool, around: str) -> None:
    redactor = Redactor([secret.encode()])
    part = secret[-keep:] if end else secret[:keep]
    out, _ = redactor.redact(f"{around}{part}…".encode() if not end else f"…{part}{around}".encode())
    piece = secret[-PARTIAL_LENGTH:] if end else secret[:PARTIAL_LENGTH]
    assert piece.encode() not in out
    assert json.dumps(out.decode(errors="replace"))  # still text


LONG_KEY = "sk-proj-" + "".join(string.ascii_letters[(i * 7) % 52] + string.digits[i % 10] for i in range(78))


@pytest.mark.parametrize(("width", "sep"), [(76, b"\r\n"), (64, b"\n"), (40, b"\\n")])
def test_long_key_folded(width: int, sep: bytes) -> None:
    """A 164-character key: fewer fold anchors per character, still every MIME/PEM width."""
    redactor = Redactor([LONG_KEY.encode()])
    for lead in range(3):
        blob = base64.b64encode(bytes(lead) + LONG_KEY.encode() + b"\x00")
        out, count = redactor.redact(sep.join(blob[i:i + width] for i in range(0, len(blob), width)))
        assert count >= 1
        assert revealed(LONG_KEY, out) == []


@pytest.mark.parametrize("secret", [SECRET, LONG_KEY, "clé-secrète-€-中文-😀-0123456789"])
def test_always_searched_anchors_fit_one_teddy_automaton(secret: str) -> None:
    """Past 64 patterns the always-on prefilter runs about ten times slower (no timing here)."""
    redactor = Redactor([secret.encode()], [b"Bearer " + secret.encode()])
    always = [masks for gate, _, masks in redactor._prefilters if not gate]
    assert len(always) == 1
    assert len(always[0]) <= 64


@pytest.mark.parametrize("body", [
    pytest.param("".join(f"\\u{ord(c):04x}" for c in SECRET), id="all-escaped"),
    pytest.param("".join(f"\\u{ord(c):04X}" if i % 3 else c for i, c in enumerate(SECRET)), id="mixed"),
    pytest.param("x\\" + "".join(f"\\u{ord(c):04x}" for c in SECRET), id="after-a-backslash"),
])
def test_json_escapes_found_through_the_sentinel(redactor: Redactor, body: str) -> None:
    out, count = redactor.redact(body.encode())
    assert count == 1
    assert out.endswith(MARKER)
