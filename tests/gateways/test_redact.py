"""gateways/redact.py and gateways/secret_forms.py on tables: each enumerated form of several kinds of
secret is redacted whole; what is and is not covered; the prefilter never misses a form."""

from __future__ import annotations

import pytest

from gateways.redact import MARKER, Redactor, forms
from gateways.secret_forms import texts
from gateways.text_regex import compile_text

SECRETS = [
    pytest.param(b"real-echo-secret-0123456789abcdef01234567", id="token"),
    pytest.param(b"ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8", id="github-shape"),
    pytest.param(b"p@ss w/rd&<x>\"'%;\\#+=", id="punctuation-and-space"),
    pytest.param("clé-secrète-€-中文-😀".encode(), id="utf-8"),
    pytest.param(b"\xffbinary\x00\x01secret\x80", id="not-utf-8"),
    pytest.param(b"abcd", id="shortest"),
]


@pytest.mark.parametrize("secret", SECRETS)
def test_every_form_is_redacted_whole(secret: bytes) -> None:
    redactor = Redactor([secret])
    for form in sorted(forms(secret)):
        assert redactor.redact(b"<" + form + b">") == (b"<" + MARKER + b">", 1), form


@pytest.mark.parametrize("secret", SECRETS)
def test_every_form_contains_an_anchor(secret: bytes) -> None:
    """The prefilter is exact only if every occurrence holds one of its anchors."""
    anchors = {a for t in texts(secret) for _, a in compile_text(t).anchors}
    for form in forms(secret):
        assert any(a in form for a in anchors), form


@pytest.mark.parametrize(("value", "count"), [
    pytest.param(b"Authorization: Bearer {s}", 1, id="bearer-literal"),
    pytest.param(b"{s}{s}{s}", 3, id="adjacent"),
    pytest.param(b"r%65al-echo-secret-0123456789abcdef012345%367", 1, id="two-chars-escaped"),
    pytest.param(b"r\\u0065al-echo-secret-0123456789abcdef01234567", 1, id="one-json-escape"),
    pytest.param(b"r&#101;&#x61;&#X6C;-echo-secret-0123456789abcdef01234567", 1, id="html-mixed-case"),
    pytest.param(b"r%2565al-echo-secret-0123456789abcdef01234567", 1, id="one-double-encoded"),
    pytest.param(b"real-echo-secret-0123456789abcdef0123456", 1, id="one-char-short-is-a-prefix"),
    pytest.param(b"76543210fedcba9876543210-terces-ohce-laer", 0, id="reversed-not-covered"),
    pytest.param(b"real-echo-secret-0123456789\nabcdef01234567", 2, id="split-by-newline-prefix-and-suffix"),
    pytest.param(b"r%5Cu0065al-echo-secret-0123456789abcdef01234567", 2,
                 id="escape-of-escape-suffix-twice"),  # its last 8 characters recur inside it
    pytest.param(b"xreal-ec", 0, id="partial-shorter-than-8"),
])
def test_coverage(value: bytes, count: int) -> None:
    secret = b"real-echo-secret-0123456789abcdef01234567"
    redactor = Redactor([secret], [b"Bearer " + secret])
    out, n = redactor.redact(value.replace(b"{s}", secret))
    assert n == count
    assert (secret in out) is False


def test_rotated_secrets_are_all_redacted() -> None:
    old, new = b"old-secret-value-1234", b"new-secret-value-5678"
    redactor = Redactor([new, old])
    assert redactor.redact(old + b" " + new) == (MARKER + b" " + MARKER, 2)


def test_short_and_empty_secrets_are_ignored() -> None:
    redactor = Redactor([b"", b"abc"])
    assert redactor.redact(b"abc") == (b"abc", 0)
    assert redactor.stream().feed(b"abc") == b"abc"


def test_repr_never_shows_the_secret() -> None:
    secret = b"real-echo-secret-0123456789abcdef01234567"
    redactor = Redactor([secret])
    assert secret.decode() not in repr(redactor)
    assert all(secret.decode() not in repr(t) for t in texts(secret))
    assert secret.decode() not in repr(compile_text(texts(secret)[0]))


@pytest.mark.parametrize("cut", [0, 1, 7, 20, 33, 60])
def test_a_last_piece_given_to_finish_is_redacted_as_the_end_of_the_body(cut: int) -> None:
    """The gateway hands the body's final piece to ``finish`` (no suffix held back for it): the
    output is the whole body's redaction wherever the previous piece ended."""
    secret = b"sk-test-0123456789abcdefghij"
    redactor = Redactor([secret])
    body = b'{"echo": "' + secret + b'", "b64": "' + sorted(forms(secret))[0] + b'"}'
    stream = redactor.stream()
    assert stream.feed(body[:cut]) + stream.finish(body[cut:]) == redactor.redact(body)[0]
