"""What the proxy refuses, each with its reason code and ZERO upstream connections.

Raw sockets give exact control of the CONNECT line, the credential and the ClientHello. The code
comes from the ``407``/``403`` JSON body, or — for refusals at the TLS layer, where there is no
HTTP to answer with — from the audit line, which names the run. A fresh run per case keeps the
denial detectors (which revoke a run after a burst) from deciding a later case.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from tests.support import proxy_client
from tests.support.proxy_client import Answer
from tests.support.proxy_policies import INDEX_HOST, METADATA_HOST, MIRROR_HOST
from tests.support.proxy_stack import ProxyStack, make_sandbox

FILES_HOST = "files.pythonhosted.org"
GRANTED = ("openai", "pypi", "pythonhosted", "intranet", "mirror")
REALM = 'Basic realm="valetkey proxy"'
REVOCATION_WAIT = 10.0


@contextmanager
def no_upstream_connection(stack: ProxyStack) -> Iterator[None]:
    before = stack.connections()
    yield
    time.sleep(0.2)  # a dial the proxy started would have been accepted by now
    after = stack.connections()
    assert after == before, {name: after[name] - before[name] for name in after if after[name] != before[name]}


def credential(stack: ProxyStack, kind: str, bundle: dict[str, Any]) -> str | None:
    """The Proxy-Authorization password a case sends."""
    if kind == "run":
        return str(bundle["env"]["HTTPS_PROXY"]).removeprefix("http://run:").rsplit("@", 1)[0]
    if kind == "none":
        return None
    if kind == "garbage":
        return "not-a-token"
    if kind == "forged":  # JWT-shaped, signed by nobody
        return "eyJhbGciOiJFUzI1NiIsImtpZCI6IngifQ.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"
    if kind == "other-audience":  # the run's real token for the openai upstream, not for the proxy
        return str(bundle["env"]["OPENAI_API_KEY"])
    raise ValueError(kind)


RUN_KINDS = ("run", "other-audience")  # credentials whose run the proxy can name


def audit_line(stack: ProxyStack, answer: Answer) -> dict[str, Any]:
    return stack.request_line(answer.json().get("request_id"))


def refused_connect(stack: ProxyStack, target: str, token: str | None) -> Answer:
    answer, sock = proxy_client.connect(stack.proxy_address, target, token)
    sock.close()
    return answer


CONNECT_CASES = [
    pytest.param("evil.example.com:443", "run", 403, "destination_not_allowed", id="unknown-host"),
    pytest.param("api.openai.com.evil.example.com:443", "run", 403, "destination_not_allowed",
                 id="allowed-name-as-prefix"),
    pytest.param("127.0.0.1:443", "run", 403, "destination_ip_literal", id="ip-literal-v4"),
    pytest.param("[::1]:443", "run", 403, "destination_ip_literal", id="ip-literal-v6"),
    pytest.param("{openai_address}", "run", 403, "destination_ip_literal", id="ip-literal-of-the-upstream"),
    pytest.param("api.openai.com:8443", "run", 403, "destination_port_not_allowed", id="wrong-port"),
    pytest.param(f"{INDEX_HOST}:80", "run", 403, "destination_port_not_allowed", id="wrong-port-destination"),
    pytest.param("api.anthropic.com:443", "run", 403, "purpose_not_granted", id="known-host-not-granted"),
    pytest.param(f"{METADATA_HOST}:443", "run", 403, "dest_metadata", id="metadata-behind-allowed-name"),
    pytest.param("api.openai.com:443", "none", 407, "missing_token", id="missing-credential"),
    # the credential comes first: a stranger learns nothing of the rules, an IP literal included
    pytest.param("127.0.0.1:443", "none", 407, "missing_token", id="ip-literal-without-credential"),
    pytest.param("evil.example.com:443", "none", 407, "missing_token", id="unknown-host-without-credential"),
    pytest.param("api.openai.com:443", "garbage", 407, "invalid_token", id="invalid-credential"),
    pytest.param("api.openai.com:443", "forged", 407, "invalid_token", id="forged-credential"),
    pytest.param("api.openai.com:443", "other-audience", 407, "audience_mismatch", id="other-audience-credential"),
]


@pytest.mark.parametrize(("target", "kind", "status", "reason"), CONNECT_CASES)
def test_connect_refused(stack: ProxyStack, target: str, kind: str, status: int, reason: str) -> None:
    bundle = stack.mint(*GRANTED)
    target = target.format(openai_address=stack.upstreams["openai"].address)
    with no_upstream_connection(stack):
        answer = refused_connect(stack, target, credential(stack, kind, bundle))
    assert (answer.status, answer.reason) == (status, reason), answer.body[:500]
    if status == 407:
        assert answer.header("proxy-authenticate") == [REALM]
    assert answer.header("content-type")[0].startswith("application/json")
    # the audit line of this decision (by the request id of the answer) names the run, when the
    # credential was the run's own
    line = audit_line(stack, answer)
    assert (line.get("reason"), line.get("decision"), line.get("status")) == (reason, "deny", status)
    named = bundle["run_id"] if kind in RUN_KINDS else ""
    assert line.get("run") == named, f"audit line of a {reason} refusal names run {line.get('run')!r}"


def test_revoked_credential(stack: ProxyStack) -> None:
    bundle = stack.mint(*GRANTED)
    token = credential(stack, "run", bundle)
    first, sock = proxy_client.connect(stack.proxy_address, "api.openai.com:443", token)
    sock.close()
    assert first.status == 200, first.body[:500]  # the credential worked before

    stack.revoke(bundle["run_id"])
    deadline = time.monotonic() + REVOCATION_WAIT
    with no_upstream_connection(stack):
        while (answer := refused_connect(stack, "api.openai.com:443", token)).status == 200:
            assert time.monotonic() < deadline, "the proxy still accepts a revoked run's credential"
            time.sleep(0.1)
    assert (answer.status, answer.reason) == (407, "token_revoked"), answer.body[:500]
    assert answer.header("proxy-authenticate") == [REALM]
    line = audit_line(stack, answer)
    assert (line.get("reason"), line.get("run")) == ("token_revoked", bundle["run_id"])


TLS_CASES = [
    pytest.param(FILES_HOST, None, "sni_missing", id="tunnel-no-sni"),
    pytest.param(FILES_HOST, "api.openai.com", "sni_mismatch", id="tunnel-sni-mismatch"),
    pytest.param(FILES_HOST, INDEX_HOST, "sni_mismatch", id="tunnel-sni-other-allowed-host"),
    pytest.param(INDEX_HOST, None, "sni_missing", id="terminate-no-sni"),
    pytest.param(INDEX_HOST, FILES_HOST, "sni_mismatch", id="terminate-sni-mismatch"),
]


@pytest.mark.parametrize(("host", "sni", "reason"), TLS_CASES)
def test_tls_refused(stack: ProxyStack, host: str, sni: str | None, reason: str) -> None:
    """Domain fronting at the TLS layer: the CONNECT is allowed, the ClientHello is not."""
    bundle = stack.mint(*GRANTED)
    with no_upstream_connection(stack):
        answer, sock = proxy_client.connect(stack.proxy_address, f"{host}:443", credential(stack, "run", bundle))
        assert answer.status == 200, answer.body[:500]
        outcome = proxy_client.handshake(sock, sni)
        if outcome.sock is not None:  # TLS 1.3: a refusal after the server's Finished shows on read
            with suppress(OSError):
                assert outcome.sock.recv(1) == b"", "the tunnel carried data after a refused ClientHello"
            outcome.sock.close()
        sock.close()
    lines = stack.audit(lambda x: x.get("run") == bundle["run_id"] and x.get("reason") == reason)
    assert lines, f"no audit line with reason {reason} for the run; proxy log:\n{stack.log_tail()}"
    assert lines[-1].get("decision", "deny") == "deny"


def terminated(stack: ProxyStack, tmp_path: Path, bundle: dict[str, Any], host: str) -> Any:
    """A TLS connection through a terminated tunnel to ``host``, verified against the bundle's CA."""
    box = make_sandbox(bundle, tmp_path)
    answer, sock = proxy_client.connect(stack.proxy_address, f"{host}:443", credential(stack, "run", bundle))
    assert answer.status == 200, answer.body[:500]
    outcome = proxy_client.handshake(sock, host, cafile=box.env["SSL_CERT_FILE"])
    assert outcome.sock is not None, outcome.error
    return outcome.sock


INNER_CASES = [
    pytest.param("GET", "/simple/x/", "evil.example.com", "host_mismatch", id="host-header-mismatch"),
    pytest.param("GET", "/simple/x/", FILES_HOST, "host_mismatch", id="host-header-other-allowed-host"),
    pytest.param("CONNECT", "api.openai.com:443", "api.openai.com:443", "method_refused", id="connect-inside"),
    pytest.param("GET", "/admin/", INDEX_HOST, "purpose_not_granted", id="path-not-granted"),
]


@pytest.mark.parametrize(("method", "path", "host_header", "reason"), INNER_CASES)
def test_inside_terminated_tunnel(stack: ProxyStack, tmp_path: Path, method: str, path: str,
                                  host_header: str, reason: str) -> None:
    bundle = stack.mint(*GRANTED)
    with no_upstream_connection(stack):
        tls = terminated(stack, tmp_path, bundle, INDEX_HOST)
        try:
            answer = proxy_client.request(tls, method, path, host_header)
        finally:
            tls.close()
    assert 400 <= answer.status < 500
    assert answer.reason == reason, answer.body[:500]
    line = audit_line(stack, answer)
    assert (line.get("reason"), line.get("run")) == (reason, bundle["run_id"])


PLAIN_CASES = [
    pytest.param(f"http://{INDEX_HOST}/simple/x/", "none", 407, "missing_token", id="no-credential"),
    pytest.param("http://evil.example.com/", "run", 403, "destination_not_allowed", id="unknown-host"),
    pytest.param(f"http://{INDEX_HOST}/simple/x/", "run", 403, "destination_port_not_allowed", id="port-80-not-named"),
    pytest.param("http://127.0.0.1/", "run", 403, "destination_ip_literal", id="ip-literal"),
    pytest.param("http://api.openai.com/v1/models", "run", 403, "destination_port_not_allowed",
                 id="https-upstream-over-http"),
    pytest.param(f"http://{MIRROR_HOST}/admin/", "run", 403, "purpose_not_granted", id="path-not-granted"),
    pytest.param(f"http://{MIRROR_HOST}/simple/x/", "garbage", 407, "invalid_token", id="invalid-credential"),
]


@pytest.mark.parametrize(("url", "kind", "status", "reason"), PLAIN_CASES)
def test_plain_http_refused(stack: ProxyStack, url: str, kind: str, status: int, reason: str) -> None:
    bundle = stack.mint(*GRANTED)
    with no_upstream_connection(stack):
        answer = proxy_client.absolute_form(stack.proxy_address, url, credential(stack, kind, bundle))
    assert (answer.status, answer.reason) == (status, reason), answer.body[:500]
    line = audit_line(stack, answer)
    assert (line.get("reason"), line.get("run")) == (reason, bundle["run_id"] if kind in RUN_KINDS else "")
