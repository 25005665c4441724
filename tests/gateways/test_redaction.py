"""Redaction end to end: a real upstream echoes the real secret in a form and place chosen by the
request (tests/support/leaks.py builds the forms with the standard library only). The sandbox
must receive none of them, the marker where each one was, and every other byte intact; the audit
line and the metric count the redactions; nothing the gateway logs carries the secret."""

from __future__ import annotations

import json
import logging
import re
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.gateway_stack import Stack, audit_line, start_gateway
from tests.support.leaks import FORMS, HEADERS, MARKER, leak_body
from tests.support.servers import ThreadedServer
from tests.support.upstreams import LEAK_GATE

LEAK = "/v1/items/leak"
LARGE = 1_000_000


@pytest.fixture(scope="module")
def bundle(gateway_stack: Stack) -> dict[str, Any]:
    return gateway_stack.mint([{"upstream": "echo", "purpose": "read_items"},
                               {"upstream": "rawleak", "purpose": "read_items"}])


@pytest.fixture
def echo(gateway_stack: Stack, bundle: dict[str, Any]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway_stack.url("echo"), timeout=30,
                      headers={"Authorization": f"Bearer {bundle['env']['ECHO_TOKEN']}"}) as client:
        yield client


def secret(stack: Stack) -> str:
    return stack.vault.secrets["echo"]


def expected_body(stack: Stack, form: str, size: int = 0) -> tuple[bytes, bytes]:
    leaked, redacted = FORMS[form](secret(stack))
    return leak_body(leaked, redacted, size)


def assert_no_secret(stack: Stack, data: bytes) -> None:
    for value in stack.vault.secrets.values():
        for name, make in FORMS.items():
            leaked, _ = make(value)
            if not name.startswith("b64-") or name in {"b64-std", "b64-url"}:
                assert leaked not in data, name
        assert value.encode() not in data


def read_all(response: httpx.Response, into: bytearray) -> None:
    for chunk in response.iter_raw():
        into += chunk


@pytest.mark.parametrize("size", [pytest.param(0, id="small"), pytest.param(LARGE, id="1MB")])
@pytest.mark.parametrize("form", [pytest.param(name, id=name) for name in FORMS])
def test_body_forms(gateway_stack: Stack, echo: httpx.Client, form: str, size: int) -> None:
    _, expected = expected_body(gateway_stack, form, size)
    response = echo.get(LEAK, params={"form": form, "size": size})
    assert response.status_code == 200, response.text[:300]
    assert response.content == expected  # marker where the secret was, every other byte intact
    assert_no_secret(gateway_stack, response.content)


@pytest.mark.parametrize("header", [pytest.param(h, id=h) for h in HEADERS])
@pytest.mark.parametrize("form", [pytest.param(name, id=name) for name in FORMS])
def test_header_forms(gateway_stack: Stack, echo: httpx.Client, form: str, header: str) -> None:
    _, redacted = FORMS[form](secret(gateway_stack))
    response = echo.get(LEAK, params={"form": form, "where": f"header:{header}"})
    assert response.status_code == 200
    values = [v for k, v in response.headers.raw if k.lower() == header.encode()]
    assert values == [HEADERS[header](redacted)]
    assert_no_secret(gateway_stack, b"\n".join(v for _, v in response.headers.raw))


SPLIT_FORMS = ["raw", "bearer", "b64-std", "b64-align1", "b64-basic", "hex-lower", "pct-all-lower",
               "pct-mixed", "json-u-upper", "html-dec-zeros"]


@pytest.mark.parametrize("form", [pytest.param(name, id=name) for name in SPLIT_FORMS])
def test_split_at_every_offset(gateway_stack: Stack, echo: httpx.Client, form: str) -> None:
    """The upstream sends the body in two pieces cut inside the form, pausing between them."""
    leaked, expected = expected_body(gateway_stack, form)
    for offset in range(1, len(leaked)):
        response = echo.get(LEAK, params={"form": form, "split": offset})
        assert response.content == expected, offset


@pytest.mark.parametrize("form", [pytest.param(n, id=n) for n in ["raw", "b64-basic", "pct-mixed",
                                                                  "json-mixed", "html-mixed"]])
def test_one_byte_chunks(gateway_stack: Stack, echo: httpx.Client, form: str) -> None:
    _, expected = expected_body(gateway_stack, form)
    response = echo.get(LEAK, params={"form": form, "chunk": 1})
    assert response.content == expected


ENCODINGS = ["gzip", "deflate", "deflate-raw", "br", "zstd", "gzip, br", "zstd, deflate, gzip"]
COMPRESSED = [
    pytest.param(encoding, size, chunk, id=f"{encoding.replace(', ', '+')}-{label}")
    for encoding in ENCODINGS
    for size, chunk, label in [(0, 0, "small"), (0, 7, "small-7-byte-chunks"), (LARGE, 0, "1MB")]
]


@pytest.mark.parametrize(("encoding", "size", "chunk"), COMPRESSED)
@pytest.mark.parametrize("form", ["raw", "b64-basic", "pct-all-upper", "json-u-lower"])
def test_compressed_bodies(gateway_stack: Stack, echo: httpx.Client, form: str, encoding: str,
                           size: int, chunk: int) -> None:
    _, expected = expected_body(gateway_stack, form, size)
    response = echo.get(LEAK, params={"form": form, "size": size, "encoding": encoding, "chunk": chunk})
    assert response.status_code == 200, response.text[:300]
    assert "content-encoding" not in response.headers
    assert "content-length" not in response.headers  # redaction may change the length: chunked
    assert response.content == expected
    assert_no_secret(gateway_stack, response.content)


@pytest.mark.parametrize(("encoding", "size"), [
    pytest.param("gzip, corrupt", 0, id="corrupt-gzip"),
    pytest.param("br, corrupt", 0, id="corrupt-br"),
    pytest.param("zstd, corrupt", 0, id="corrupt-zstd"),
    pytest.param("compress", 0, id="unknown-coding"),
    pytest.param("gzip, x-unheard-of", 0, id="unknown-stacked"),
])
def test_undecodable_body_is_refused(gateway_stack: Stack, echo: httpx.Client, encoding: str,
                                     size: int) -> None:
    response = echo.get(LEAK, params={"form": "raw", "size": size, "encoding": encoding})
    assert (response.status_code, response.json()["error"]) == (502, "undecodable_response")
    assert_no_secret(gateway_stack, response.content)
    line = audit_line(gateway_stack, response.json()["request_id"])
    assert (line["decision"], line["reason"]) == ("error", "undecodable_response")


@pytest.mark.parametrize(("encoding", "reason"), [
    pytest.param("gzip, corrupt-late", "undecodable_response", id="corrupt-after-first-bytes"),
    pytest.param("bomb", "decompression_bomb", id="zstd-bomb"),
])
def test_stream_is_cut_when_decoding_fails_late(gateway_stack: Stack, echo: httpx.Client, encoding: str,
                                                reason: str) -> None:
    received = bytearray()
    with echo.stream("GET", LEAK, params={"form": "raw", "size": LARGE, "encoding": encoding}) as response:
        assert response.status_code == 200
        request_id = response.headers["x-valetkey-request-id"]
        with pytest.raises(httpx.RemoteProtocolError):
            read_all(response, received)
    assert secret(gateway_stack).encode() not in received
    assert 0 < len(received) < 80 * 1024 * 1024  # the bomb is cut past the floor, well before 100 MB
    assert audit_line(gateway_stack, request_id)["reason"] == reason


@pytest.mark.parametrize("form", [pytest.param(n, id=n) for n in ["raw", "b64-basic", "pct-all-upper"]])
def test_sse_events_arrive_one_by_one_redacted(gateway_stack: Stack, echo: httpx.Client, form: str) -> None:
    """The upstream sends the next event only after the test has received the previous one, so a
    gateway holding back a finished event (with a redacted secret in it) would deadlock here."""
    while LEAK_GATE.acquire(blocking=False):
        pass
    received = []
    with echo.stream("GET", LEAK, params={"form": form, "where": "sse"}) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                received.append(line[6:])
                if len(received) <= 3:
                    LEAK_GATE.release()
    _, redacted = FORMS[form](secret(gateway_stack))
    assert received[:3] == [json.dumps({"n": n, "echo": redacted.decode()}) for n in range(3)]
    assert received[3] == "[DONE]"


def test_redactions_are_counted_in_audit_and_metric(gateway_stack: Stack, echo: httpx.Client) -> None:
    metric = re.compile(r'^valetkey_gateway_redactions_total\{upstream="echo"\} (\S+)$', re.M)

    def counted() -> float:
        found = metric.search(gateway_stack.metrics("echo"))
        return float(found.group(1)) if found else 0.0

    before = counted()
    _, expected = expected_body(gateway_stack, "b64-basic", LARGE)
    body = echo.get(LEAK, params={"form": "b64-basic", "size": LARGE})
    header = echo.get(LEAK, params={"form": "raw", "where": "header:set-cookie"})
    clean = echo.get("/v1/items/1/redirect-away")  # nothing to redact
    counts = {r.headers["x-valetkey-request-id"]: n for r, n in
              [(body, expected.count(MARKER)), (header, 1), (clean, 0)]}
    for request_id, count in counts.items():
        assert audit_line(gateway_stack, request_id)["redactions"] == count
    assert counted() - before >= expected.count(MARKER) + 1  # others may add to it, never fewer


@pytest.fixture(scope="module")
def rawleak(gateway_stack: Stack) -> Iterator[ThreadedServer]:
    server = start_gateway(gateway_stack, "rawleak")
    try:
        yield server
    finally:
        server.stop()


def _wire(gateway: ThreadedServer, token: str) -> bytes:
    """Everything the gateway writes back for one request, exactly as on the wire."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(f"GET /v1/items HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                     "Connection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


@pytest.mark.parametrize(("response", "body"), [
    pytest.param(b"HTTP/1.1 200 token {secret} accepted\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                 b"ok", id="status-reason"),
    pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Token\r\nConnection: close\r\n\r\n"
                 b"2\r\nok\r\n0\r\nX-Token: {secret}\r\n\r\n", b"ok", id="trailer"),
    pytest.param(b"HTTP/1.1 401 {secret}\r\nWWW-Authenticate: Bearer error_description=\"{secret}\"\r\n"
                 b"Content-Length: 0\r\nConnection: close\r\n\r\n", b"", id="reason-and-challenge"),
])
def test_status_reason_and_trailers_never_reach_the_sandbox(gateway_stack: Stack, rawleak: ThreadedServer,
                                                            bundle: dict[str, Any], response: bytes,
                                                            body: bytes) -> None:
    value = gateway_stack.vault.secrets["rawleak"].encode()
    assert gateway_stack.raw is not None
    gateway_stack.raw.response = response.replace(b"{secret}", value)
    wire = _wire(rawleak, bundle["env"]["RAWLEAK_TOKEN"])
    head, _, rest = wire.partition(b"\r\n\r\n")
    status = head.split(b"\r\n")[0]
    assert status in (b"HTTP/1.1 200 OK", b"HTTP/1.1 401 Unauthorized"), status  # standard phrase only
    assert value not in wire
    assert body in rest


def test_no_secret_in_logs_or_audit(gateway_stack: Stack, echo: httpx.Client,
                                    caplog: pytest.LogCaptureFixture) -> None:
    """Leaks in every place, refusals and a cut stream: no log record and no audit line holds the
    secret in any form."""
    caplog.set_level(logging.DEBUG)
    ids = []
    for params in ({"form": "raw"}, {"form": "b64-basic", "where": "header:location"},
                   {"form": "pct-all-upper", "encoding": "gzip"}, {"form": "raw", "encoding": "gzip, corrupt"},
                   {"form": "json-u-lower", "where": "header:www-authenticate"}):
        response = echo.get(LEAK, params=params)
        ids.append(response.headers["x-valetkey-request-id"])
    with echo.stream("GET", LEAK, params={"form": "raw", "size": LARGE, "encoding": "gzip, corrupt-late"}) as r:
        ids.append(r.headers["x-valetkey-request-id"])
        with pytest.raises(httpx.RemoteProtocolError):
            read_all(r, bytearray())
    lines = json.dumps([audit_line(gateway_stack, i) for i in ids]).encode()
    logged = (caplog.text + json.dumps([r.getMessage() for r in caplog.records])).encode()
    assert b"request_id" in logged
    for text in (lines, logged):
        assert_no_secret(gateway_stack, text)
