"""The gateway end to end: real echo upstreams that accept only the real secret, a real broker,
real OpenBao and Redis. Every refusal is checked for its reason code AND for zero upstream
connections; every success for what the upstream saw and what the client did not."""

from __future__ import annotations

import base64
import json
import logging
import socket
import string
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.support.gateway_stack import Stack, audit_line

ITEM = {"upstream": "echo", "purpose": "read_items"}
WRITE = {"upstream": "echo", "purpose": "write_item", "params": {"item": "42"}}
GHP = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"  # shape only, not a real token


@pytest.fixture
def bundle(gateway_stack: Stack) -> dict[str, Any]:
    return gateway_stack.mint([ITEM, WRITE, {"upstream": "echo", "purpose": "upload"},
                               {"upstream": "keyed", "purpose": "read_items"},
                               {"upstream": "gitbasic", "purpose": "read_items"},
                               {"upstream": "queried", "purpose": "read_items"}])


@pytest.fixture
def echo(gateway_stack: Stack, bundle: dict[str, Any]) -> Iterator[httpx.Client]:
    token = bundle["env"]["ECHO_TOKEN"]
    with httpx.Client(base_url=gateway_stack.url("echo"),
                      headers={"Authorization": f"Bearer {token}"}, timeout=10) as client:
        yield client


def secrets_of(stack: Stack) -> list[str]:
    return list(stack.vault.secrets.values())


def assert_clean(stack: Stack, response: httpx.Response) -> None:
    """Nothing the client received carries any real secret."""
    everything = response.text + json.dumps(list(response.headers.items()))
    for secret in secrets_of(stack):
        assert secret not in everything


class Refused:
    """Counts upstream connections around a request that must be refused before dialling."""

    def __init__(self, stack: Stack, name: str) -> None:
        self.upstream = stack.upstreams[name]

    def __enter__(self) -> Refused:
        self.before = (self.upstream.connections, len(self.upstream.seen))
        return self

    def __exit__(self, *exc: object) -> None:
        assert (self.upstream.connections, len(self.upstream.seen)) == self.before, "upstream was dialled"


def test_upstream_sees_real_secret_client_never_does(gateway_stack: Stack, echo: httpx.Client,
                                                     bundle: dict[str, Any]) -> None:
    response = echo.get("/v1/items", params={"q": "x"})
    assert response.status_code == 200, response.text
    seen = gateway_stack.upstreams["echo"].seen[-1]
    assert seen.header("authorization") == [f"Bearer {gateway_stack.vault.secrets['echo']}"]
    assert bundle["env"]["ECHO_TOKEN"] not in json.dumps(seen.headers) + seen.query
    assert seen.header("host") == [f"127.0.0.1:{gateway_stack.upstreams['echo'].port}"]
    assert seen.header("accept-encoding") == ["identity"]
    assert "[REDACTED:valetkey]" in response.text  # the echo of Authorization came back redacted
    assert_clean(gateway_stack, response)
    assert response.headers["x-valetkey-request-id"]


def test_client_credentials_and_routing_headers_are_stripped(gateway_stack: Stack, echo: httpx.Client) -> None:
    opaque = "".join(string.ascii_letters[i % 52] for i in range(40))
    response = echo.get("/v1/items", headers={
        "Cookie": f"session={opaque}", "Proxy-Authorization": f"Bearer {opaque}", "X-Api-Key": opaque,
        "X-Forwarded-For": "10.0.0.1", "X-Forwarded-Host": "evil.example", "Forwarded": "for=1.2.3.4",
        "X-Original-URL": "/admin", "X-Rewrite-URL": "/admin", "X-Real-IP": "10.0.0.2",
        "Range": "bytes=0-10", "Accept-Encoding": "gzip", "Connection": "keep-alive, X-Secret-Hop",
        "X-Secret-Hop": opaque, "X-HTTP-Method-Override": "DELETE", "X-Custom": "kept",
    })
    assert response.status_code == 200
    seen = gateway_stack.upstreams["echo"].seen[-1]
    names = {k for k, _ in seen.headers}
    assert opaque not in json.dumps(seen.headers)
    for gone in ("cookie", "proxy-authorization", "x-api-key", "x-forwarded-for", "x-forwarded-host",
                 "forwarded", "x-original-url", "x-rewrite-url", "x-real-ip", "range", "x-secret-hop",
                 "x-http-method-override"):
        assert gone not in names
    assert seen.header("x-custom") == ["kept"]
    assert seen.method == "GET"
    assert seen.path == "/v1/items"


def test_host_header_never_changes_the_destination(gateway_stack: Stack, echo: httpx.Client) -> None:
    response = echo.get("/v1/items", headers={"Host": "evil.example:8080"})
    assert response.status_code == 200
    port = gateway_stack.upstreams["echo"].port
    assert gateway_stack.upstreams["echo"].seen[-1].header("host") == [f"127.0.0.1:{port}"]


REFUSALS = [
    pytest.param("GET", "/v1/admin", {}, None, 403, "purpose_not_granted", id="path-outside-purposes"),
    pytest.param("DELETE", "/v1/items/42", {}, None, 403, "purpose_not_granted", id="method-outside"),
    pytest.param("POST", "/v1/items/43", {}, b"{}", 403, "purpose_not_granted", id="bound-param-mismatch"),
    pytest.param("GET", "/v1/items/42/../../admin", {}, None, 403, "purpose_not_granted", id="dotdot"),
    pytest.param("GET", "/v1/items/%2e%2e/admin", {}, None, 403, "purpose_not_granted", id="encoded-dotdot"),
    pytest.param("GET", "/v1/items/a%2Fb", {}, None, 403, "purpose_not_granted", id="encoded-slash"),
    pytest.param("GET", "/v1//items", {}, None, 403, "purpose_not_granted", id="double-slash"),
    pytest.param("GET", "/v1/items;x=1", {}, None, 403, "purpose_not_granted", id="matrix-param"),
    pytest.param("GET", "/V1/ITEMS", {}, None, 403, "purpose_not_granted", id="case"),
    pytest.param("GET", "/v1/items/%252e%252e", {}, None, 403, "purpose_not_granted", id="double-encoded"),
    pytest.param("GET", "/v1/items/a%5cb", {}, None, 403, "purpose_not_granted", id="encoded-backslash"),
    pytest.param("GET", "/v1/items/", {}, None, 403, "purpose_not_granted", id="trailing-slash"),
    pytest.param("POST", "/v1/items/42", {"Content-Type": "application/json"}, b"x" * 2000, 413,
                 "body_too_large", id="body-over-purpose-limit"),
    pytest.param("POST", "/v1/items/42", {"Content-Type": "application/json"},
                 json.dumps({"note": f"use {GHP}"}).encode(), 403, "credential_passthrough", id="json-body"),
    pytest.param("POST", "/v1/items/42", {"Content-Type": "application/x-www-form-urlencoded"},
                 f"token={GHP}".encode(), 403, "credential_passthrough", id="form-body"),
    pytest.param("GET", f"/v1/items?access_token={GHP}", {}, None, 403, "credential_passthrough", id="query"),
    pytest.param("GET", "/v1/items", {"X-Extra": f"token {GHP}"}, None, 403, "credential_passthrough",
                 id="custom-header"),
    pytest.param("GET", "/v1/items", {"Cookie": f"gh={GHP}"}, None, 403, "credential_passthrough", id="cookie"),
    pytest.param("GET", "/v1/items", {"Proxy-Authorization": f"Bearer {GHP}"}, None, 403,
                 "credential_passthrough", id="proxy-authorization"),
    pytest.param("GET", "/v1/items", {"X-Api-Key": "sk-proj-" + "a1B2" * 12}, None, 403,
                 "credential_passthrough", id="openai-key"),
    pytest.param("GET", f"/v1/items/{GHP}", {}, None, 403, "credential_passthrough", id="path"),
    pytest.param("GET", "/v1/items/" + "".join(f"%{b:02X}" for b in GHP.encode()), {}, None, 403,
                 "credential_passthrough", id="path-percent-encoded"),
    pytest.param("GET", "/v1/items/" + "".join(f"%25{b:02X}" for b in GHP.encode()), {}, None, 403,
                 "credential_passthrough", id="path-percent-encoded-twice"),
    pytest.param("TRACE", "/v1/items", {}, None, 405, "method_refused", id="trace"),
    # llhttp parses only registered methods: TRACK (and any made-up verb) ends at the parser
    pytest.param("TRACK", "/v1/items", {}, None, 400, "malformed_request", id="track"),
    pytest.param("FROB", "/v1/items", {}, None, 400, "malformed_request", id="unknown-method"),
]


@pytest.mark.parametrize(("method", "path", "headers", "body", "status", "code"), REFUSALS)
def test_refusals(gateway_stack: Stack, echo: httpx.Client, method: str, path: str,
                  headers: dict[str, str], body: bytes | None, status: int, code: str) -> None:
    with Refused(gateway_stack, "echo"):
        request = echo.build_request(method, path, headers=headers, content=body)
        request.url = request.url.copy_with(raw_path=path.encode())
        response = echo.send(request)
    assert (response.status_code, response.json()["error"]) == (status, code), response.text
    assert GHP not in response.text


TOKEN_REFUSALS = [
    pytest.param(None, 401, "missing_token", id="no-token"),
    pytest.param("Bearer", 401, "missing_token", id="empty-bearer"),
    pytest.param("Bearer not-a-token", 401, "invalid_token", id="garbage"),
    pytest.param("Basic eDp5", 401, "missing_token", id="wrong-scheme"),
    pytest.param("Bearer " + "e30." * 2 + "x", 401, "invalid_token", id="unsigned-jwt"),
    pytest.param(f"Bearer {GHP}", 403, "credential_passthrough", id="real-credential-as-placeholder"),
]


@pytest.mark.parametrize(("authorization", "status", "code"), TOKEN_REFUSALS)
def test_token_refusals(gateway_stack: Stack, authorization: str | None, status: int, code: str) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    with Refused(gateway_stack, "echo"):
        response = httpx.get(f"{gateway_stack.url('echo')}/v1/items", headers=headers)
    assert (response.status_code, response.json()["error"]) == (status, code)
    if status == 401:
        assert response.headers["www-authenticate"].startswith("Bearer realm=")


def test_token_for_another_gateway(gateway_stack: Stack, bundle: dict[str, Any]) -> None:
    with Refused(gateway_stack, "echo"):
        response = httpx.get(f"{gateway_stack.url('echo')}/v1/items",
                             headers={"Authorization": f"Bearer {bundle['env']['KEYED_TOKEN']}"})
    assert (response.status_code, response.json()["error"]) == (401, "audience_mismatch")


def test_ended_run_is_refused(gateway_stack: Stack) -> None:
    fresh = gateway_stack.mint([ITEM])
    headers = {"Authorization": f"Bearer {fresh['env']['ECHO_TOKEN']}"}
    assert httpx.get(f"{gateway_stack.url('echo')}/v1/items", headers=headers).status_code == 200
    gateway_stack.end(fresh["run_id"])
    wait_revoked(gateway_stack, "echo", fresh["run_id"])
    with Refused(gateway_stack, "echo"):
        response = httpx.get(f"{gateway_stack.url('echo')}/v1/items", headers=headers)
    assert (response.status_code, response.json()["error"]) == (401, "token_revoked")


def wait_revoked(stack: Stack, name: str, run_id: str) -> None:
    """Pub/sub delivery is asynchronous: wait (bounded) until this replica has the revocation."""
    gateway = stack.app(name).gateway
    assert gateway is not None
    for _ in range(200):
        if any(r.name == run_id for r in gateway.revocations.state.records()):
            return
        time.sleep(0.005)
    raise AssertionError("revocation never arrived")


def test_api_key_header_placement(gateway_stack: Stack, bundle: dict[str, Any]) -> None:
    response = httpx.get(f"{gateway_stack.url('keyed')}/v1/items",
                         headers={"x-api-key": bundle["env"]["KEYED_TOKEN"],
                                  "Authorization": "Bearer opaque-client-value"})
    assert response.status_code == 200, response.text
    seen = gateway_stack.upstreams["keyed"].seen[-1]
    assert seen.header("x-api-key") == [gateway_stack.vault.secrets["keyed"]]
    assert seen.header("authorization") == []
    assert_clean(gateway_stack, response)


def test_basic_placement_challenge_then_success(gateway_stack: Stack, bundle: dict[str, Any]) -> None:
    url = f"{gateway_stack.url('gitbasic')}/v1/items"
    with Refused(gateway_stack, "gitbasic"):
        challenge = httpx.get(url)
    assert challenge.status_code == 401
    assert challenge.headers["www-authenticate"].startswith('Basic realm="valetkey gitbasic"')
    token = bundle["env"]["GITBASIC_TOKEN"]
    response = httpx.get(url, auth=("whoever", token))
    assert response.status_code == 200, response.text
    expected = base64.b64encode(f"x-access-token:{gateway_stack.vault.secrets['gitbasic']}".encode())
    assert gateway_stack.upstreams["gitbasic"].seen[-1].header("authorization") == [f"Basic {expected.decode()}"]
    assert_clean(gateway_stack, response)
    with Refused(gateway_stack, "gitbasic"):
        passthrough = httpx.get(url, auth=("x-access-token", GHP))
    assert passthrough.json()["error"] == "credential_passthrough"


def test_query_placement(gateway_stack: Stack, bundle: dict[str, Any]) -> None:
    token = bundle["env"]["QUERIED_TOKEN"]
    response = httpx.get(f"{gateway_stack.url('queried')}/v1/items", params={"key": token, "page": "2"})
    assert response.status_code == 200, response.text
    seen = gateway_stack.upstreams["queried"].seen[-1]
    assert f"key={gateway_stack.vault.secrets['queried']}" in seen.query
    assert "page=2" in seen.query
    assert token not in seen.query
    assert_clean(gateway_stack, response)


def test_redirects_are_not_followed_and_own_origin_is_rewritten(echo: httpx.Client) -> None:
    home = echo.get("/v1/items/1/redirect-home")
    assert home.status_code == 302
    assert home.headers["location"] == "/v1/items/next?page=2"
    away = echo.get("/v1/items/1/redirect-away")
    assert away.status_code == 302
    assert away.headers["location"] == "https://elsewhere.example/landing?x=1"


def test_sse_is_forwarded_event_by_event(gateway_stack: Stack, echo: httpx.Client) -> None:
    """The upstream sends the next event only after the client has received the previous one:
    a gateway that held bytes back would deadlock here (and time out), so arrival order proves it."""
    upstream = gateway_stack.upstreams["echo"]
    received: list[str] = []
    with echo.stream("GET", "/v1/sse") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                received.append(line[6:])
                if len(received) <= 3:
                    upstream.sse_gate.release()  # lets the upstream emit the next event
    assert received == ["event 0.", "event 1.", "event 2.", "event 3.", "[DONE]"]


def test_upstream_timeout_is_504(echo: httpx.Client) -> None:
    response = echo.get("/v1/slow")
    assert (response.status_code, response.json()["error"]) == (504, "upstream_timeout")


@pytest.mark.parametrize(("raw", "status", "code"), [
    pytest.param(b"GET http://evil.example/v1/items HTTP/1.1\r\nHost: a\r\n", 400, "absolute_form_target",
                 id="absolute-form"),
    pytest.param(b"GET * HTTP/1.1\r\nHost: a\r\n", 400, "absolute_form_target", id="asterisk-form"),
    pytest.param(b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n", 405, "method_refused",
                 id="connect"),
    pytest.param(b"GET /v1/items HTTP/1.1\r\nHost: a\r\nHost: b\r\n", 400, "duplicate_host",
                 id="duplicate-host"),
    pytest.param(b"POST /v1/items/42 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n",
                 400, "malformed_request", id="cl-and-te"),  # llhttp refuses it before the pipeline
    pytest.param(b"GET /v1/items HTTP/1.1\r\nHost: a\r\n" + b"X-Pad: " + b"p" * 70_000 + b"\r\n", 400,
                 "malformed_request", id="head-over-64k"),
    pytest.param(b"GET /v1/items?" + b"q" * 70_000 + b" HTTP/1.1\r\nHost: a\r\n", 400, "malformed_request",
                 id="target-over-64k"),
    pytest.param(b"OPTIONS * HTTP/1.1\r\nHost: a\r\n", 400, "absolute_form_target", id="options-asterisk"),
    pytest.param(b"POST /v1/items/42 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 3\r\n",
                 400, "malformed_request", id="conflicting-cl"),
])
def test_raw_framing_refusals(gateway_stack: Stack, bundle: dict[str, Any], raw: bytes, status: int,
                              code: str) -> None:
    token = bundle["env"]["ECHO_TOKEN"].encode()
    request = raw + b"Authorization: Bearer " + token + b"\r\n\r\n"
    if b"chunked" in raw:
        request += b"0\r\n\r\n"
    with Refused(gateway_stack, "echo"):
        answer = _raw_exchange(int(gateway_stack.url("echo").rsplit(":", 1)[1]), request)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status}".encode()), answer
    assert json.loads(body)["error"] == code


def _flood(sock: socket.socket) -> int:
    """Send a line that never ends (up to 64 MiB) until the gateway closes; the bytes sent."""
    sent = 0
    try:
        while sent < 64 * 1024 * 1024:
            sock.sendall(b"p" * 65536)
            sent += 65536
    except OSError:
        pass  # the gateway closed the connection
    return sent


def test_a_head_that_never_ends_is_cut_off(gateway_stack: Stack) -> None:
    """httptools buffers a header until its line ends; the server stops reading well before memory
    does: 400 and the connection closed after ~64 KiB plus one read, however much more is sent."""
    port = int(gateway_stack.url("echo").rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /v1/items HTTP/1.1\r\nHost: a\r\nX-Pad: ")
        sent, answer = _flood(sock), b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert sent < 8 * 1024 * 1024
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"] == "malformed_request"


def test_a_trailer_that_never_ends_is_cut_off(gateway_stack: Stack, bundle: dict[str, Any]) -> None:
    """Trailers after a chunked body are bounded like the head (httptools buffers them too)."""
    port = int(gateway_stack.url("echo").rsplit(":", 1)[1])
    token = bundle["env"]["ECHO_TOKEN"].encode()
    head = (b"POST /v1/items/42 HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nAuthorization: Bearer " + token + b"\r\n\r\n2\r\n{}\r\n0\r\nX-T: ")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head)
        sent = _flood(sock)
    assert sent < 8 * 1024 * 1024


def test_absolute_form_target_is_never_audited_as_sent(gateway_stack: Stack) -> None:
    """``GET http://host/…?key=…``: refused, and neither the query nor the rest of the URL (it
    may hold userinfo) reaches the audit line."""
    port = int(gateway_stack.url("echo").rsplit(":", 1)[1])
    answer = _raw_exchange(port, f"GET http://u:{GHP}@api.example/v1/items?api_key={GHP} HTTP/1.1\r\n"
                                 "Host: a\r\n\r\n".encode())
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), answer
    line = audit_line(gateway_stack, json.loads(body)["request_id"])
    assert line["reason"] == "absolute_form_target"
    assert GHP not in json.dumps(line)
    assert "api.example" not in json.dumps(line)


def _raw_exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return data


def test_hot_path_makes_no_vault_call_or_jwks_fetch(gateway_stack: Stack, echo: httpx.Client) -> None:
    gateway = gateway_stack.app("echo").gateway
    assert gateway is not None
    echo.get("/v1/items")
    vault_calls, fetches = gateway.vault.calls, gateway.keys.fetches
    for _ in range(25):
        assert echo.get("/v1/items").status_code == 200
    assert (gateway.vault.calls, gateway.keys.fetches) == (vault_calls, fetches)


def test_audit_lines_for_allowed_and_denied(gateway_stack: Stack, echo: httpx.Client,
                                            bundle: dict[str, Any]) -> None:
    allowed = echo.get("/v1/items", params={"secret_q": "value-never-logged"})
    denied = echo.get("/v1/admin")
    ids = {allowed.headers["x-valetkey-request-id"]: "allow", denied.json()["request_id"]: "deny"}
    client = redis.Redis.from_url(gateway_stack.redis_url)
    try:
        lines = {}
        for _ in range(100):
            entries = client.xrevrange("valetkey:audit", count=200)
            lines = {json.loads(f[b"line"])["request_id"]: json.loads(f[b"line"])
                     for _, f in entries if f.get(b"kind") == b"request"}
            if set(ids) <= set(lines):
                break
            time.sleep(0.05)
        raw = json.dumps([lines[i] for i in ids])
    finally:
        client.close()
    for request_id, decision in ids.items():
        line = lines[request_id]
        assert line["decision"] == decision
        assert set(line) >= {"time", "request_id", "run", "runtime", "upstream", "purpose", "method", "path",
                             "decision", "reason", "status", "bytes_in", "bytes_out", "duration_ms",
                             "upstream_addr"}
        assert line["run"] == bundle["run_id"]
        assert line["runtime"] == "tester"
    assert lines[allowed.headers["x-valetkey-request-id"]]["path"] == "/v1/items?secret_q=***"
    assert lines[denied.json()["request_id"]]["reason"] == "purpose_not_granted"
    assert "value-never-logged" not in raw
    assert bundle["env"]["ECHO_TOKEN"] not in raw
    for secret in secrets_of(gateway_stack):
        assert secret not in raw


def test_metrics_count_reasons(gateway_stack: Stack, echo: httpx.Client) -> None:
    echo.get("/v1/admin")
    metrics = gateway_stack.metrics("echo")
    assert 'valetkey_gateway_requests_total{decision="deny",reason="purpose_not_granted",upstream="echo"}' in metrics
    ready = httpx.get(f"{gateway_stack.url('echo')}/.valetkey/readyz").json()
    assert ready["checks"] == {"secret": True, "egress": True, "jwks": True, "revocations": True}


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_the_sandbox_port_serves_no_metrics(gateway_stack: Stack, method: str) -> None:
    """Metrics count every run's refusals and bytes: only the operator listener serves them."""
    response = httpx.request(method, f"{gateway_stack.url('echo')}/.valetkey/metrics")
    assert response.status_code == 404
    if method == "GET":
        assert response.json()["error"] == "not_found"
    assert "valetkey_gateway" not in response.text
    assert "valetkey_gateway_requests_total" in gateway_stack.metrics("echo")


def test_info_tells_the_sandbox_only_how_to_use_the_gateway(gateway_stack: Stack) -> None:
    info = httpx.get(f"{gateway_stack.url('echo')}/.valetkey/info").json()
    assert set(info) == {"upstream", "base_url", "placement", "header", "format", "query_param", "env"}
    assert info["env"] == {"placeholder": "ECHO_TOKEN", "base_url": "ECHO_URL", "base_path": ""}
    text = json.dumps(info)
    for absent in ("read_items", "why", "version", "redis", "vault", gateway_stack.broker_url):
        assert absent not in text


def test_no_secret_or_token_in_any_log_record(gateway_stack: Stack, bundle: dict[str, Any],
                                              caplog: pytest.LogCaptureFixture) -> None:
    """Query placement puts the secret in the upstream URL: no logger may print that URL."""
    caplog.set_level(logging.DEBUG)
    token = bundle["env"]["QUERIED_TOKEN"]
    assert httpx.get(f"{gateway_stack.url('queried')}/v1/items", params={"key": token}).status_code == 200
    httpx.get(f"{gateway_stack.url('queried')}/v1/admin", params={"key": token})
    httpx.get(f"{gateway_stack.url('queried')}/v1/items", params={"key": GHP})
    text = caplog.text + json.dumps([r.getMessage() for r in caplog.records])
    assert "request_id" in text  # the audit lines were captured
    for secret in secrets_of(gateway_stack):
        assert secret not in text
    assert token not in text
    assert GHP not in text


def test_metrics_on_a_port_of_their_own(gateway_stack: Stack) -> None:
    """Prometheus can scrape a listener the sandbox never reaches (VALETKEY_METRICS_LISTEN)."""
    from tests.support.gateway_stack import start_gateway
    from valetkey.dev.services import free_port

    port = free_port()
    server = start_gateway(gateway_stack, "echo", VALETKEY_METRICS_LISTEN=f"127.0.0.1:{port}")
    try:
        token = gateway_stack.mint([ITEM])["env"]["ECHO_TOKEN"]
        httpx.get(f"{server.url}/v1/items", headers={"Authorization": f"Bearer {token}"})
        scraped = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        server.stop()
    assert 'valetkey_gateway_requests_total{decision="allow",reason="ok",upstream="echo"}' in scraped


def test_upstream_cookies_never_cross_requests(gateway_stack: Stack) -> None:
    """The gateway's one upstream client serves every run: it must keep no cookie jar."""
    first = gateway_stack.mint([ITEM])["env"]["ECHO_TOKEN"]
    second = gateway_stack.mint([ITEM])["env"]["ECHO_TOKEN"]
    url = gateway_stack.url("echo")
    set_cookie = httpx.get(f"{url}/v1/items/set-cookie", headers={"Authorization": f"Bearer {first}"})
    assert set_cookie.headers["set-cookie"].startswith("session=run-a-session")
    httpx.get(f"{url}/v1/items", headers={"Authorization": f"Bearer {second}"})
    assert gateway_stack.upstreams["echo"].seen[-1].header("cookie") == []


def test_client_hanging_up_mid_upload_is_not_a_denial(gateway_stack: Stack) -> None:
    """A client that goes away while sending its body (a cancelled call, a load generator
    stopping) is audited ``client_disconnected`` and never trips the denial-burst auto-revoke."""
    token = gateway_stack.mint([WRITE])["env"]["ECHO_TOKEN"]
    port = int(gateway_stack.url("echo").rsplit(":", 1)[1])
    head = (b"POST /v1/items/42 HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\nAuthorization: Bearer " + token.encode() + b"\r\n\r\n{\"a\":")
    for _ in range(12):  # over the default denial burst (10 a minute)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(head)
    client = redis.Redis.from_url(gateway_stack.redis_url)
    try:
        for _ in range(100):
            lines = [json.loads(f[b"line"]) for _, f in client.xrevrange("valetkey:audit", count=300)]
            hung_up = [line for line in lines if line.get("reason") == "client_disconnected"]
            if len(hung_up) >= 12:
                break
            time.sleep(0.05)
    finally:
        client.close()
    assert len(hung_up) >= 12
    time.sleep(0.3)  # the detectors run after the lines are written
    answer = httpx.post(f"{gateway_stack.url('echo')}/v1/items/42", json={"a": 1},
                        headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
