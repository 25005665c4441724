"""Hostile echoes (issue #11) end to end: a real upstream returns the real secret split across
server-sent events, folded across lines, in UTF-16/32, or in part; a real gateway stands between.
Each test asserts the marker is there and that nothing the sandbox receives — the raw bytes, the
events one by one, their joined data and text deltas, the body decoded as UTF-16/32, the body with
its whitespace removed — reveals the secret (``leaks.revealed``)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.support.gateway_stack import Stack, audit_line
from tests.support.leaks import FORMS, HOSTILE, MARKER, joined, leak_body, revealed

LEAK = "/v1/items/leak"
FOLDED = [n for n in HOSTILE if n.startswith(("b64-", "hex-"))]  # and base64 of UTF-16LE
WIDE = [n for n in HOSTILE if n.startswith("utf-")]
PARTIAL = [n for n in HOSTILE if n.startswith(("prefix-", "suffix-"))]


@pytest.fixture(scope="module")
def echo(gateway_stack: Stack) -> Iterator[httpx.Client]:
    bundle = gateway_stack.mint([{"upstream": "echo", "purpose": "read_items"}])
    with httpx.Client(base_url=gateway_stack.url("echo"), timeout=30,
                      headers={"Authorization": f"Bearer {bundle['env']['ECHO_TOKEN']}"}) as client:
        yield client


def secret(stack: Stack) -> str:
    return stack.vault.secrets["echo"]


def check(stack: Stack, response: httpx.Response, markers: bytes = MARKER) -> None:
    assert response.status_code == 200, response.text[:300]
    assert markers in response.content
    assert revealed(secret(stack), response.content) == []
    assert audit_line(stack, response.headers["x-valetkey-request-id"])["redactions"] >= 1


@pytest.mark.parametrize("chunk", [pytest.param(0, id="whole"), pytest.param(7, id="7-byte-chunks")])
@pytest.mark.parametrize("form", [pytest.param(n, id=n) for n in FOLDED + PARTIAL])
def test_folded_and_partial_forms(gateway_stack: Stack, echo: httpx.Client, form: str, chunk: int) -> None:
    check(gateway_stack, echo.get(LEAK, params={"hostile": form, "form": "raw", "chunk": chunk}))


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", "text/event-stream",
                                          "application/octet-stream", "application/x-unheard-of"])
@pytest.mark.parametrize("charset", ["utf-16-le", "utf-16-be", "utf-16", "utf-32-le", "utf-32-be", "utf-32"])
def test_whole_body_in_utf16_utf32(gateway_stack: Stack, echo: httpx.Client, charset: str,
                                   content_type: str) -> None:
    """The whole body is text in a wide encoding (with a BOM for utf-16 / utf-32): the marker is
    written in the body's encoding, so the sandbox decodes it like the rest."""
    response = echo.get(LEAK, params={"form": "raw", "charset": charset, "type": content_type, "chunk": 5})
    check(gateway_stack, response, MARKER.decode().encode(charset.removesuffix("-be").removesuffix("-le")
                                                          + ("-be" if charset.endswith("-be") else "-le")))
    text = response.content.decode(charset)
    assert text == '{"debug": "[REDACTED:valetkey]", "n": 1}\n'


@pytest.mark.parametrize("charset", ["utf-16-le", "utf-16-be", "utf-16"])
@pytest.mark.parametrize("form", ["b64-basic", "b64-std", "b64-align2"])
def test_base64_inside_a_utf16_body(gateway_stack: Stack, echo: httpx.Client, form: str, charset: str) -> None:
    """A UTF-16 page quoting a Basic header: the base64 text, in UTF-16."""
    leaked, redacted = FORMS[form](secret(gateway_stack))
    _, expected = leak_body(leaked, redacted, 0)
    response = echo.get(LEAK, params={"form": form, "charset": charset})
    assert response.status_code == 200
    assert response.content.decode(charset) == expected.decode()


@pytest.mark.parametrize("form", [pytest.param(n, id=n) for n in WIDE])
def test_wide_form_inside_a_utf8_body(gateway_stack: Stack, echo: httpx.Client, form: str) -> None:
    check(gateway_stack, echo.get(LEAK, params={"hostile": form, "form": "raw"}),
          MARKER.decode().encode("utf-16-le" if "16" in form else "utf-32-le")[:8])


SSE_CASES = [pytest.param(style, form, parts, id=f"{style}-{form}-{parts}")
             for style in ("raw", "crlf", "openai", "anthropic")
             for form, parts in (("raw", 2), ("raw", 5), ("raw", 41), ("b64-std", 3), ("pct-all-upper", 4))]


@pytest.mark.parametrize(("style", "form", "parts"), SSE_CASES)
def test_secret_split_across_events(gateway_stack: Stack, echo: httpx.Client, style: str, form: str,
                                    parts: int) -> None:
    response = echo.get(LEAK, params={"form": form, "where": "sse-split", "style": style, "parts": parts})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events, data, text = joined(response.content)
    value = secret(gateway_stack)
    for event in events:  # no event on its own reveals it
        assert revealed(value, event) == []
    for view in (data, text):  # nor does what the client joins
        assert revealed(value, view.encode()) == [], view
    assert MARKER.decode() in (text if style in ("openai", "anthropic") else data)
    assert events[-1] == b"data: [DONE]"
    assert "The key is: " in data  # the text around it is intact
    assert "(end)" in data
    line = audit_line(gateway_stack, response.headers["x-valetkey-request-id"])
    assert line["redactions"] >= 1


@pytest.mark.parametrize("parts", [2, 7])
def test_secret_split_across_json_lines(gateway_stack: Stack, echo: httpx.Client, parts: int) -> None:
    """Streamed JSON lines (application/x-ndjson) are joined like events: each line's strings."""
    response = echo.get(LEAK, params={"form": "raw", "where": "sse-split", "style": "ndjson", "parts": parts,
                                      "type": "application/x-ndjson"})
    lines = [json.loads(line) for line in response.content.splitlines()]
    text = "".join(line.get("response", "") for line in lines)
    assert revealed(secret(gateway_stack), text.encode()) == []
    assert text == "The key is: [REDACTED:valetkey] (end)"
    assert lines[-1] == {"done": True}


def test_events_without_a_pending_match_are_not_held(gateway_stack: Stack, echo: httpx.Client) -> None:
    """The existing gated stream: each event is released before the upstream sends the next."""
    from tests.support.upstreams import LEAK_GATE

    while LEAK_GATE.acquire(blocking=False):
        pass
    received = []
    with echo.stream("GET", LEAK, params={"form": "raw", "where": "sse"}) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                received.append(line)
                if len(received) <= 3:
                    LEAK_GATE.release()
    assert len(received) == 4
    assert all(MARKER.decode() in r for r in received[:3])


