"""Hosts no destination names, asked about one request at a time (a runtime's ``unlisted_hosts``).

Against the in-process proxy stack (OpenBao, redis-server, broker, TLS and plain echo upstreams):
the CONNECT (or plain-http request) to such a host is admitted without resolving it, each request
inside waits for a person's decision on that request, recorded through the broker, and only an
approved request is resolved, guarded and sent. Nothing is remembered for the host.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import pytest

from tests.gateways.test_approvals import decide, pending_of
from tests.proxy.conftest import (
    ASK,
    ASK_DENIED,
    ASK_META,
    ASK_PLAIN,
    ProxyStack,
    basic,
    connect_raw,
    json_body,
)
from tests.proxy.test_proxy import audit_for
from tests.support.gateway_stack import audit_line

BODY = b'{"status": "deploy finished"}'
URLS = {"https": f"https://{ASK}/v1/status?x=1", "http": f"http://{ASK_PLAIN}/v1/status?x=1"}
ECHOES = {"https": "ask", "http": "ask-plain"}


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


def post(stack: ProxyStack, pool: ThreadPoolExecutor, token: str, url: str,
         client: httpx.Client | None = None) -> Future[httpx.Response]:
    def send() -> httpx.Response:
        headers = {"Authorization": "Bearer sk-client-own-credential", "Content-Type": "application/json"}
        if client is not None:
            return client.post(url, content=BODY, headers=headers, timeout=30)
        with stack.client(token) as own:
            return own.post(url, content=BODY, headers=headers, timeout=30)
    return pool.submit(send)


def seen(stack: ProxyStack, scheme: str) -> int:
    return sum(1 for s in stack.echoes[ECHOES[scheme]].seen if s.path == "/v1/status")


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_an_approved_request_reaches_the_host_once_and_the_next_asks_again(
        proxy_stack: ProxyStack, pool: ThreadPoolExecutor, scheme: str) -> None:
    run, _, token = proxy_stack.mint(["secure/read_items"], runtime="asker")
    admin = proxy_stack.vault.admin_token
    before = seen(proxy_stack, scheme)
    with proxy_stack.client(token) as client:  # one tunnel (https) for both requests
        held = post(proxy_stack, pool, token, URLS[scheme], client)
        (approval,) = pending_of(proxy_stack.broker_url, admin, run)
        host = ASK if scheme == "https" else ASK_PLAIN
        assert (approval["upstream"], approval["purpose"], approval["method"]) == (
            f"unlisted:{host}", "unlisted_host", "POST")
        assert approval["preview"].startswith("?x=1\n")  # the audit masks query values; the approver reads them
        assert "deploy finished" in approval["preview"]
        assert not held.done()
        assert seen(proxy_stack, scheme) == before  # held: nothing sent, nothing resolved
        answer = decide(proxy_stack.broker_url, admin, approval, "approve", digest=approval["digest"])
        assert answer.status_code == 200, answer.text
        response = held.result(timeout=15)
        assert response.status_code == 200, response.text
        got = [s for s in proxy_stack.echoes[ECHOES[scheme]].seen if s.path == "/v1/status"][before:]
        assert len(got) == 1
        assert (got[0].body, got[0].query) == (BODY, "x=1")
        assert got[0].header("authorization") == []  # the client's credential stripped, none injected
        line = audit_line(proxy_stack, response.headers["x-valetkey-request-id"])
        assert (line["reason"], line["upstream"], line["host"], line["approval"]) == (
            "ok", "(unlisted)", host, approval["id"])
        assert line["approved_by"] == answer.json()["decided_by"]

        # nothing remembered: the same request on the same connection waits for a person again
        again = post(proxy_stack, pool, token, URLS[scheme], client)
        (second,) = pending_of(proxy_stack.broker_url, admin, run)
        assert second["id"] != approval["id"]
        assert not again.done()
        decide(proxy_stack.broker_url, admin, second, "deny", reason="once was enough")
        refused = again.result(timeout=15)
    assert (refused.status_code, refused.json()["error"]) == (403, "approval_denied")
    assert seen(proxy_stack, scheme) == before + 1
    if scheme == "https":  # the tunnel's own line, when it ends: admitted, the host named, no address
        connect = audit_for(proxy_stack, run, "CONNECT", "ok")
        assert (connect["upstream"], connect["host"], connect["upstream_addr"]) == ("(unlisted)", ASK, "")


def test_denied_request_never_reaches_the_host(proxy_stack: ProxyStack, pool: ThreadPoolExecutor) -> None:
    run, _, token = proxy_stack.mint(["secure/read_items"], runtime="asker")
    admin = proxy_stack.vault.admin_token
    connections = proxy_stack.echoes["ask"].connections
    held = post(proxy_stack, pool, token, URLS["https"])
    (approval,) = pending_of(proxy_stack.broker_url, admin, run)
    decide(proxy_stack.broker_url, admin, approval, "deny", reason="not that host").raise_for_status()
    response = held.result(timeout=15)

    assert (response.status_code, response.json()["error"]) == (403, "approval_denied")
    assert proxy_stack.echoes["ask"].connections == connections
    line = audit_line(proxy_stack, response.headers["x-valetkey-request-id"])
    assert (line["reason"], line["host"], line["upstream_addr"]) == ("approval_denied", ASK, "")


def test_nobody_decides_approval_timeout(proxy_stack: ProxyStack, pool: ThreadPoolExecutor) -> None:
    run, _, token = proxy_stack.mint(["secure/read_items"], runtime="asker-quick")
    connections = proxy_stack.echoes["ask"].connections
    response = post(proxy_stack, pool, token, URLS["https"]).result(timeout=20)

    assert (response.status_code, response.json()["error"]) == (403, "approval_timeout")
    assert proxy_stack.echoes["ask"].connections == connections
    line = audit_line(proxy_stack, response.headers["x-valetkey-request-id"])
    assert (line["reason"], line["run"], line["host"]) == ("approval_timeout", run, ASK)


def test_an_approved_request_to_a_metadata_address_is_still_refused(
        proxy_stack: ProxyStack, pool: ThreadPoolExecutor) -> None:
    run, _, token = proxy_stack.mint(["secure/read_items"], runtime="asker")
    admin = proxy_stack.vault.admin_token
    held = post(proxy_stack, pool, token, f"https://{ASK_META}/v1/status")
    (approval,) = pending_of(proxy_stack.broker_url, admin, run)
    decide(proxy_stack.broker_url, admin, approval, "approve", digest=approval["digest"]).raise_for_status()
    response = held.result(timeout=15)

    assert (response.status_code, response.json()["error"]) == (403, "dest_metadata")


def test_revoking_the_run_cancels_its_waiting_request(proxy_stack: ProxyStack, pool: ThreadPoolExecutor) -> None:
    run, _, token = proxy_stack.mint(["secure/read_items"], runtime="asker")
    admin = proxy_stack.vault.admin_token
    held = post(proxy_stack, pool, token, URLS["https"])
    (approval,) = pending_of(proxy_stack.broker_url, admin, run)
    httpx.post(f"{proxy_stack.broker_url}/v1/revocations", headers={"X-Vault-Token": admin},
               json={"scope": "run", "name": run, "reason": "stop"}).raise_for_status()
    response = held.result(timeout=15)

    assert (response.status_code, response.json()["error"]) == (401, "token_revoked")
    shown = httpx.get(f"{proxy_stack.broker_url}/v1/approvals/{approval['id']}",
                      headers={"X-Vault-Token": admin}).json()
    assert shown["state"] == "cancelled"


CONNECT_CASES = [
    # (runtime, authority, status, reason): refused at the CONNECT, no approval asked
    pytest.param("asker", f"{ASK_DENIED}:443", 403, "enterprise_denied", id="deny-list-wins"),
    pytest.param("tester", f"{ASK}:443", 403, "destination_not_allowed", id="runtime-may-not-ask"),
    pytest.param("asker", f"{ASK}:8443", 403, "destination_not_allowed", id="port-not-asked-about"),
    pytest.param("asker", "elsewhere.example.test:443", 403, "destination_not_allowed", id="host-not-asked-about"),
    pytest.param("asker", "10.0.0.1:443", 403, "destination_ip_literal", id="ip-literal"),
]


@pytest.mark.parametrize(("runtime", "authority", "status", "reason"), CONNECT_CASES)
def test_connect_refusals(proxy_stack: ProxyStack, runtime: str, authority: str, status: int,
                          reason: str) -> None:
    run, _, token = proxy_stack.mint(["secure/read_items"], runtime=runtime)
    sock, head = connect_raw(proxy_stack, authority, {"Proxy-Authorization": basic(token)})
    sock.close()

    assert head.startswith(b"HTTP/1.1 %d" % status), head
    assert json_body(head)["error"] == reason
    answer = httpx.get(f"{proxy_stack.broker_url}/v1/approvals",
                       headers={"X-Vault-Token": proxy_stack.vault.admin_token})
    assert [a for a in answer.json()["approvals"] if a["run"] == run] == []


def test_a_plain_request_to_a_denied_host_is_refused_without_asking(proxy_stack: ProxyStack) -> None:
    _, _, token = proxy_stack.mint(["secure/read_items"], runtime="asker")
    with httpx.Client(proxy=proxy_stack.proxy_url(token)) as client:
        response = client.get(f"http://{ASK_DENIED}/v1/status")
    assert (response.status_code, response.json()["error"]) == (403, "enterprise_denied")


def test_a_body_over_the_limit_is_refused_before_asking(proxy_stack: ProxyStack) -> None:
    _, _, token = proxy_stack.mint(["secure/read_items"], runtime="asker")
    with proxy_stack.client(token) as client:
        response = client.post(URLS["https"], content=b"x" * 2048)
    assert (response.status_code, response.json()["error"]) == (413, "body_too_large")


@pytest.mark.parametrize("where", ["body", "query", "header"])
def test_the_run_token_never_goes_to_an_unlisted_host(proxy_stack: ProxyStack, where: str) -> None:
    run, _, token = proxy_stack.mint(["secure/read_items"], runtime="asker")
    body = f'{{"leak": "{token}"}}'.encode() if where == "body" else BODY
    url = URLS["https"] + (f"&t={token}" if where == "query" else "")
    headers = {"X-Carried": token} if where == "header" else {}
    with proxy_stack.client(token) as client:
        response = client.post(url, content=body, headers=headers)
    assert (response.status_code, response.json()["error"]) == (403, "credential_passthrough")
    assert token not in response.text
    answer = httpx.get(f"{proxy_stack.broker_url}/v1/approvals",
                       headers={"X-Vault-Token": proxy_stack.vault.admin_token})
    assert [a for a in answer.json()["approvals"] if a["run"] == run] == []
