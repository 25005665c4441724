"""Property tests on Redactor / StreamRedactor directly: random secrets over several alphabets,
random surrounding bytes, random chunk boundaries.

Expected output, precisely: when the bytes around each form are drawn from outside the redactor's
alphabet (bytes no occurrence can hold), the output is the input with each form replaced by exactly
one marker. With arbitrary surrounding bytes a match may legitimately take in neighbouring bytes
that complete a form, so the properties are then: streaming equals whole-body redaction for any
chunking, and no form of the secret survives anywhere except overlapping a marker.
"""

from __future__ import annotations

import base64
import itertools
import string

from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from gateways.redact import MARKER, Redactor, forms

ALPHABETS = {
    "alnum": string.ascii_letters + string.digits,
    "token": string.ascii_letters + string.digits + "-_.~",
    "base64": string.ascii_letters + string.digits + "+/=",
    "hex": "0123456789abcdef",
    "printable": string.ascii_letters + string.digits + string.punctuation + " ",
    "unicode": string.ascii_letters + "éüßñ€中文😀",
}
secrets = st.sampled_from(sorted(ALPHABETS)).flatmap(
    lambda name: st.text(alphabet=ALPHABETS[name], min_size=8, max_size=40)).map(str.encode)
# Each example compiles a redactor (~0.3 s of regex compilation): few examples, no "explain" phase
# (its tracer makes compilation many times slower).
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])


def chunked(redactor: Redactor, data: bytes, cuts: list[int]) -> tuple[bytes, int]:
    stream = redactor.stream()
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    out = b"".join(stream.feed(data[a:b]) for a, b in itertools.pairwise(points))
    return out + stream.finish(), stream.count


def outside(redactor: Redactor) -> list[int]:
    return [b for b in range(256) if b not in redactor.alphabet]


@SETTINGS
@given(secret=secrets, data=st.data())
def test_forms_between_foreign_bytes_become_one_marker_each(secret: bytes, data: st.DataObject) -> None:
    redactor = Redactor([secret])
    chosen = data.draw(st.lists(st.sampled_from(sorted(forms(secret))), min_size=1, max_size=4))
    foreign = st.lists(st.sampled_from(outside(redactor)), max_size=12).map(bytes)
    fillers = [data.draw(foreign)] + [data.draw(foreign.filter(bool)) for _ in chosen[1:]] + [data.draw(foreign)]
    body = fillers[0] + b"".join(f + fill for f, fill in zip(chosen, fillers[1:], strict=True))
    expected = MARKER.join(fillers)
    assert redactor.redact(body) == (expected, len(chosen))
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=12))
    assert chunked(redactor, body, cuts) == (expected, len(chosen))


@SETTINGS
@given(secret=secrets, data=st.data())
def test_arbitrary_surroundings_no_leak_and_stream_equals_whole(secret: bytes, data: st.DataObject) -> None:
    redactor = Redactor([secret], [b"Bearer " + secret])
    all_forms = sorted(forms(secret))
    chosen = data.draw(st.lists(st.sampled_from(all_forms), min_size=1, max_size=4))
    around = st.binary(max_size=24)
    body = data.draw(around) + b"".join(f + data.draw(around) for f in chosen)
    whole, count = redactor.redact(body)
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=16))
    assert chunked(redactor, body, cuts) == (whole, count)
    markers = [i for i in range(len(whole)) if whole.startswith(MARKER, i)]
    for form in [*all_forms, secret]:
        start = whole.find(form)
        while start != -1:
            assert any(m < start + len(form) and start < m + len(MARKER) for m in markers), form
            start = whole.find(form, start + 1)


@SETTINGS
@given(secret=secrets, prefix=st.binary(max_size=6), suffix=st.binary(max_size=6), url=st.booleans(),
       pad=st.booleans(), data=st.data())
def test_secret_inside_a_longer_base64_blob(secret: bytes, prefix: bytes, suffix: bytes, url: bool,
                                            pad: bool, data: st.DataObject) -> None:
    """Only the characters fully determined by the secret are required; when the secret ends the
    blob its last partial character and the padding go too."""
    redactor = Redactor([secret])
    blob = (base64.urlsafe_b64encode if url else base64.b64encode)(prefix + secret + suffix)
    blob = blob if pad else blob.rstrip(b"=")
    first, last = -(-8 * len(prefix) // 6), 8 * (len(prefix) + len(secret)) // 6
    assume(blob.count(blob[first:last]) == 1)
    fill = bytes(outside(redactor)[:3])
    body = fill + blob + fill
    out, count = redactor.redact(body)
    assert blob[first:last] not in out
    possible = {fill + blob[:first] + MARKER + blob[j:] + fill for j in range(last, len(blob) + 1)}
    assert out in possible, (prefix, suffix)
    if not suffix:
        assert out == fill + blob[:first] + MARKER + fill
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=12))
    assert chunked(redactor, body, cuts) == (out, count)


@SETTINGS
@given(secret=secrets, data=st.data())
def test_only_a_possible_beginning_is_held_back(secret: bytes, data: st.DataObject) -> None:
    """A partial form at the end of a chunk is held, exactly it; a chunk ending in a byte no
    occurrence can hold (an SSE event's blank line) is passed on whole."""
    redactor = Redactor([secret])
    form = data.draw(st.sampled_from(sorted(forms(secret))))
    cut = data.draw(st.integers(1, len(form) - 1))
    head = bytes(data.draw(st.lists(st.sampled_from(outside(redactor)), max_size=8)))
    assert redactor.held_suffix(head + form[:cut]) == cut
    if b"\n" not in redactor.alphabet:
        event = b"data: " + head + form + b"\n\n"
        stream = redactor.stream()
        assert stream.feed(event) == b"data: " + head + MARKER + b"\n\n"
        assert stream.finish() == b""
