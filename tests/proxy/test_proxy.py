"""The egress proxy end to end in process: CONNECT decisions with their reason codes and zero
upstream connections, tunnels checked by SNI, terminated tunnels on the gateway pipeline."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import ssl
import time
from typing import Any

import httpx
import pytest
import redis

from proxy import splice
from tests.proxy.conftest import API, DOCS, META, TUN, ProxyStack, basic, connect_raw, json_body


def audit_for(stack: ProxyStack, run: str, method: str, reason: str) -> dict[str, Any]:
    client = redis.Redis.from_url(stack.redis_url)
    try:
        for _ in range(100):
            for _, fields in client.xrevrange("valetkey:audit", count=500):
                line: dict[str, Any] = json.loads(fields[b"line"])
                if line.get("run") == run and line.get("method") == method and line.get("reason") == reason:
                    return line
            time.sleep(0.05)
    finally:
        client.close()
    raise AssertionError(f"no audit line for {run} {method} {reason}")


def test_upstream_through_proxy_gets_real_secret(proxy_stack: ProxyStack) -> None:
    run, placeholder, proxy_token = proxy_stack.mint(["secure/read_items"])
    echo = proxy_stack.echoes["secure"]
    with proxy_stack.client(proxy_token) as client:
        response = client.get(f"https://{API}/v1/items", headers={"Authorization": f"Bearer {placeholder}"})
    assert response.status_code == 200, response.text
    seen = echo.seen[-1]
    assert seen.header("authorization") == [f"Bearer {echo.secret}"]
    assert echo.secret not in response.text
    assert audit_for(proxy_stack, run, "GET", "ok")["upstream"] == "secure"


def test_destination_terminated_checks_purpose(proxy_stack: ProxyStack) -> None:
    _run, _, proxy_token = proxy_stack.mint(["docs/read"])
    with proxy_stack.client(proxy_token) as client:
        ok = client.get(f"https://{DOCS}/docs/intro", headers={"Authorization": "Bearer whatever"})
        refused = client.post(f"https://{DOCS}/docs/intro", content=b"x")
    assert ok.status_code == 200, ok.text
    assert proxy_stack.echoes["docs"].seen[-1].header("authorization") == []  # stripped
    assert refused.status_code == 403
    assert refused.json()["error"] == "purpose_not_granted"


@pytest.mark.parametrize("kernel_relay", [pytest.param(True, id="splice"), pytest.param(False, id="protocols")])
def test_tunnel_passes_bytes(proxy_stack: ProxyStack, monkeypatch: pytest.MonkeyPatch, kernel_relay: bool) -> None:
    """Both relays: splice(2) where Linux has it, asyncio protocols elsewhere."""
    monkeypatch.setattr(splice, "AVAILABLE", kernel_relay and splice.AVAILABLE)
    _, _, proxy_token = proxy_stack.mint(["tun/connect"])
    context = ssl.create_default_context(cafile=str(proxy_stack.upstream_ca))  # the real server's CA
    with httpx.Client(proxy=proxy_stack.proxy_url(proxy_token), verify=context) as client:
        response = client.get(f"https://{TUN}/anything")
    assert response.status_code == 200
    assert proxy_stack.echoes["tun"].seen[-1].path == "/anything"


def test_plain_http_request(proxy_stack: ProxyStack) -> None:
    _, _, proxy_token = proxy_stack.mint(["plain/read"])
    with httpx.Client(proxy=proxy_stack.proxy_url(proxy_token)) as client:
        ok = client.get("http://plain.example.test/docs/a")
        refused = client.get("http://plain.example.test/other")
    assert ok.status_code == 200, ok.text
    assert refused.status_code == 403
    assert refused.json()["error"] == "purpose_not_granted"


CONNECT_CASES = [
    # (authority, credential, status, reason)
    ("unknown.example.test:443", "good", 403, "destination_not_allowed"),
    ("127.0.0.1:443", "good", 403, "destination_ip_literal"),
    ("[::1]:443", "good", 403, "destination_ip_literal"),
    (f"{DOCS}:8443", "good", 403, "destination_port_not_allowed"),
    (f"{TUN}:443", "good", 403, "purpose_not_granted"),
    (f"{META}:443", "good", 403, "dest_metadata"),
    (f"{DOCS}:443", None, 407, "missing_token"),
    (f"{DOCS}:443", "garbage", 407, "invalid_token"),
    (f"{DOCS}:443", "upstream", 407, "audience_mismatch"),
    (f"{DOCS}:443", "revoked", 407, "token_revoked"),
]


@pytest.mark.parametrize(("authority", "credential", "status", "reason"), CONNECT_CASES)
def test_connect_refusals(proxy_stack: ProxyStack, authority: str, credential: str | None, status: int,
                          reason: str) -> None:
    run, placeholder, proxy_token = proxy_stack.mint(["docs/read", "meta/read"])
    if credential == "revoked":
        proxy_stack.end(run)
        time.sleep(0.3)
    token = {"good": proxy_token, "revoked": proxy_token, "garbage": "a.b.c", "upstream": placeholder}.get(
        credential or "", "")
    before = {name: echo.connections for name, echo in proxy_stack.echoes.items()}
    sock, head = connect_raw(proxy_stack, authority, {"Proxy-Authorization": basic(token)} if credential else {})
    sock.close()
    assert head.startswith(b"HTTP/1.1 %d" % status), head
    assert json_body(head)["error"] == reason
    if status == 407:
        assert b"proxy-authenticate: Basic" in head.lower().replace(b"basic", b"Basic")
    assert {name: echo.connections for name, echo in proxy_stack.echoes.items()} == before


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


# hostile Proxy-Authorization values: each a 407 with its code and the challenge, never a silent close
CREDENTIAL_CASES = [
    pytest.param("Basic \xff\xfe", "missing_token", id="bytes-outside-ascii"),
    pytest.param("Basic " + _b64(b"run:\xff\xfe"), "missing_token", id="not-utf8-inside"),
    pytest.param("Basic " + _b64("run:ÿ".encode()), "invalid_token", id="utf8-not-a-token"),
    pytest.param("Basic " + _b64(b"run:\x00\x00\x00"), "invalid_token", id="nul-token"),
    pytest.param("Basic " + _b64(b"run:"), "missing_token", id="empty-password"),
    pytest.param("Basic " + _b64(b"no-colon"), "missing_token", id="no-colon"),
    pytest.param("Basic", "missing_token", id="scheme-only"),
    pytest.param("Basic ===", "missing_token", id="padding-only"),
    pytest.param("Bearer a.b.c", "missing_token", id="bearer-scheme"),
    pytest.param("Basic " + "A" * 20000, "missing_token", id="long-zero-bytes"),
]


@pytest.mark.parametrize(("value", "reason"), CREDENTIAL_CASES)
def test_hostile_proxy_credential(proxy_stack: ProxyStack, value: str, reason: str) -> None:
    before = {name: echo.connections for name, echo in proxy_stack.echoes.items()}
    sock, head = connect_raw(proxy_stack, f"{DOCS}:443", {"Proxy-Authorization": value})
    sock.close()
    assert head.startswith(b"HTTP/1.1 407"), head[:300]
    assert json_body(head)["error"] == reason
    assert b"proxy-authenticate: basic" in head.lower()
    assert {name: echo.connections for name, echo in proxy_stack.echoes.items()} == before


def _hello(sock: socket.socket, server_name: str | None) -> None:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with context.wrap_socket(sock, server_hostname=server_name) as tls:
            tls.recv(1)
    except (ssl.SSLError, OSError):
        pass


@pytest.mark.parametrize(("target", "grant", "sni", "reason"), [
    (TUN, "tun/connect", None, "sni_missing"),
    (TUN, "tun/connect", DOCS, "sni_mismatch"),
    (DOCS, "docs/read", None, "sni_missing"),
    (DOCS, "docs/read", TUN, "sni_mismatch"),
])
def test_sni_refusals(proxy_stack: ProxyStack, target: str, grant: str, sni: str | None, reason: str) -> None:
    run, _, proxy_token = proxy_stack.mint([grant])
    before = {name: echo.connections for name, echo in proxy_stack.echoes.items()}
    sock, head = connect_raw(proxy_stack, f"{target}:443", {"Proxy-Authorization": basic(proxy_token)})
    assert head.startswith(b"HTTP/1.1 200"), head
    _hello(sock, sni)
    sock.close()
    assert audit_for(proxy_stack, run, "CONNECT", reason)
    assert {name: echo.connections for name, echo in proxy_stack.echoes.items()} == before


def test_host_must_match_connect(proxy_stack: ProxyStack) -> None:
    _, _, proxy_token = proxy_stack.mint(["docs/read"])
    with proxy_stack.client(proxy_token) as client:
        response = client.get(f"https://{DOCS}/docs/a", headers={"Host": TUN})
    assert response.status_code == 400
    assert response.json()["error"] == "host_mismatch"


def test_placeholder_of_another_run(proxy_stack: ProxyStack) -> None:
    _, placeholder, _ = proxy_stack.mint(["secure/read_items"])
    _, _, proxy_token = proxy_stack.mint(["secure/read_items"])
    with proxy_stack.client(proxy_token) as client:
        response = client.get(f"https://{API}/v1/items", headers={"Authorization": f"Bearer {placeholder}"})
    assert response.status_code == 403
    assert response.json()["error"] == "run_mismatch"


def test_connect_inside_a_terminated_tunnel(proxy_stack: ProxyStack) -> None:
    run, _, proxy_token = proxy_stack.mint(["docs/read", "tun/connect"])
    sock, head = connect_raw(proxy_stack, f"{DOCS}:443", {"Proxy-Authorization": basic(proxy_token)})
    assert head.startswith(b"HTTP/1.1 200"), head
    context = ssl.create_default_context(cafile=str(proxy_stack.proxy_ca))
    with context.wrap_socket(sock, server_hostname=DOCS) as tls:
        tls.sendall(f"CONNECT {TUN}:443 HTTP/1.1\r\nHost: {TUN}:443\r\n\r\n".encode())
        answer = tls.recv(65536)
    assert answer.startswith(b"HTTP/1.1 405"), answer
    assert b"method_refused" in answer
    assert audit_for(proxy_stack, run, "CONNECT", "method_refused")  # audited with the tunnel's run


def test_revoking_the_run_cuts_its_tunnel(proxy_stack: ProxyStack) -> None:
    run, _, proxy_token = proxy_stack.mint(["tun/connect"])
    sock, head = connect_raw(proxy_stack, f"{TUN}:443", {"Proxy-Authorization": basic(proxy_token)})
    assert head.startswith(b"HTTP/1.1 200"), head
    context = ssl.create_default_context(cafile=str(proxy_stack.upstream_ca))
    tls = context.wrap_socket(sock, server_hostname=TUN)
    tls.sendall(f"GET /x HTTP/1.1\r\nHost: {TUN}\r\n\r\n".encode())
    assert tls.recv(65536).startswith(b"HTTP/1.1 200")
    proxy_stack.end(run)
    tls.settimeout(5)
    deadline = time.monotonic() + 5
    closed = False
    while time.monotonic() < deadline and not closed:
        try:
            closed = tls.recv(65536) == b""
        except (ssl.SSLError, OSError):
            closed = True
    tls.close()
    assert closed
    assert audit_for(proxy_stack, run, "CONNECT", "token_revoked")


def test_selftest_proxy_check(proxy_stack: ProxyStack) -> None:
    from valetkey import selftest_proxy

    _, _, proxy_token = proxy_stack.mint(["docs/read"])
    env = {"HTTPS_PROXY": proxy_stack.proxy_url(proxy_token)}
    passed, evidence = selftest_proxy.check(env, "https://outside.example.test/", 5.0)
    assert passed, evidence
    assert "destination_not_allowed" in evidence[0]
    assert "407" in evidence[1]
    # a proxy that lets the outside host through fails the check
    passed, evidence = selftest_proxy.check(env, f"https://{DOCS}/", 5.0)
    assert not passed


def test_probes_on_the_proxy_listener(proxy_stack: ProxyStack) -> None:
    base = f"http://127.0.0.1:{proxy_stack.proxy_port}/.valetkey"
    assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{base}/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"]["upstream:secure"] is True
    assert httpx.get(f"{base}/metrics").status_code == 404


def test_knocking_outside_the_allowlist_alerts_and_revokes(proxy_stack: ProxyStack) -> None:
    run, _, proxy_token = proxy_stack.mint(["docs/read"])
    for i in range(10):  # the default denial burst: 10 in 60 s, revoked automatically
        sock, head = connect_raw(proxy_stack, f"host{i}.outside.test:443",
                                 {"Proxy-Authorization": basic(proxy_token)})
        sock.close()
        assert json_body(head)["error"] == "destination_not_allowed"
    client = redis.Redis.from_url(proxy_stack.redis_url)
    try:
        kinds: set[str] = set()
        for _ in range(100):
            kinds = {json.loads(f[b"line"]).get("alert", "") for _, f in client.xrange("valetkey:alerts")
                     if json.loads(f[b"line"]).get("run") == run}
            if {"denial_burst", "probing"} <= kinds:
                break
            time.sleep(0.05)
    finally:
        client.close()
    assert {"denial_burst", "probing"} <= kinds
    for _ in range(50):
        sock, head = connect_raw(proxy_stack, f"{DOCS}:443", {"Proxy-Authorization": basic(proxy_token)})
        sock.close()
        if json_body(head).get("error") == "token_revoked":
            break
        time.sleep(0.1)
    assert json_body(head)["error"] == "token_revoked"


def test_revoking_a_destination_by_name(proxy_stack: ProxyStack) -> None:
    _, _, proxy_token = proxy_stack.mint(["tun/connect", "docs/read"])
    sock, head = connect_raw(proxy_stack, f"{TUN}:443", {"Proxy-Authorization": basic(proxy_token)})
    assert head.startswith(b"HTTP/1.1 200"), head
    context = ssl.create_default_context(cafile=str(proxy_stack.upstream_ca))
    tls = context.wrap_socket(sock, server_hostname=TUN)
    admin = {"X-Vault-Token": proxy_stack.vault.admin_token}
    httpx.post(f"{proxy_stack.broker_url}/v1/revocations", headers=admin,
               json={"scope": "upstream", "name": "tun", "reason": "test"}).raise_for_status()
    try:
        tls.settimeout(5)
        with contextlib.suppress(ssl.SSLError, OSError):
            assert tls.recv(1) == b""  # the open tunnel is cut
        sock2, head2 = connect_raw(proxy_stack, f"{TUN}:443", {"Proxy-Authorization": basic(proxy_token)})
        sock2.close()
        assert head2.startswith(b"HTTP/1.1 403"), head2
        assert json_body(head2)["error"] == "token_revoked"
        with proxy_stack.client(proxy_token) as client:  # the run's other destinations still work
            assert client.get(f"https://{DOCS}/docs/a").status_code == 200
    finally:
        tls.close()
        httpx.delete(f"{proxy_stack.broker_url}/v1/revocations/upstream/tun", headers=admin).raise_for_status()


def test_ca_rotation_staged_then_signing(proxy_stack: ProxyStack, tmp_path: Any) -> None:
    """Bundles trust a staged CA at once; the proxy signs with it only from its active_from on.
    Runs in the shared stack last (test order): it leaves the new CA signing, trusted by proxy_ca."""
    from contract.ca import CA_PUBLIC_PATH, cert_pem, load_certs
    from valetkey.bootstrap import open_client
    from valetkey.proxy_bootstrap import rotate_ca

    _, _, proxy_token = proxy_stack.mint(["docs/read"])
    old = proxy_stack.proxy_ca.read_text()
    with open_client(proxy_stack.vault.addr, proxy_stack.vault.admin_token) as admin:
        rotate_ca(admin, overlap=3)
        both = admin.secrets.kv.v2.read_secret_version(path=CA_PUBLIC_PATH, mount_point="secret",
                                                       raise_on_deleted_version=True)["data"]["data"]["certs"]
    new_only = tmp_path / "new.pem"
    new_only.write_text("".join(cert_pem(c) for c in load_certs(both)[1:]))

    def issuer_trusted(cafile: str) -> bool:
        sock, _ = connect_raw(proxy_stack, f"{DOCS}:443", {"Proxy-Authorization": basic(proxy_token)})
        try:
            with ssl.create_default_context(cafile=cafile).wrap_socket(sock, server_hostname=DOCS):
                return True
        except ssl.SSLError:
            return False

    time.sleep(1.5)  # a CA refresh: still the old CA signing
    assert issuer_trusted(str(proxy_stack.proxy_ca))
    assert not issuer_trusted(str(new_only))
    time.sleep(4)  # past active_from and one more refresh: the new CA signs
    assert issuer_trusted(str(new_only))
    proxy_stack.proxy_ca.write_text(both)  # what a bundle minted after the rotation carries
    assert old in both


def test_the_proxy_runs_the_gateway_steps() -> None:
    """Every gateway step runs in the proxy, in order: a step added to the pipeline is not skipped."""
    from gateways import pipeline
    from proxy.steps import DESTINATION_STEPS, UPSTREAM_STEPS, authenticate_tunnel, strip_credentials

    assert [s for s in UPSTREAM_STEPS if s in pipeline.STEPS] == list(pipeline.STEPS)
    swapped = {pipeline.authenticate: authenticate_tunnel, pipeline.inject_secret: strip_credentials}
    assert [s for s in DESTINATION_STEPS if s in pipeline.STEPS] == [
        s for s in pipeline.STEPS if s not in swapped]
    assert set(swapped.values()) <= set(DESTINATION_STEPS)
