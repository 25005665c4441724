"""A wildcard destination (``*.docs.example``, tunnelled) through the proxy: which names it owns,
and that owning both names never lets one name front for the other.

``*.docs.example`` matches one or more labels in front of ``docs.example`` (``policies/hosts.py``):
``a.docs.example`` and ``deep.b.docs.example``, never the apex ``docs.example`` or a name that only
ends in the same letters. Each allowed name is a real TLS server with its own certificate from the
test CA; each refused one dials nothing (the apex has a server too, which must see no connection).
"""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path

import pytest

from tests.e2e.proxy.conftest import names_destination
from tests.e2e.proxy.test_proxy_clients import curl
from tests.e2e.proxy.test_proxy_refusals import credential, no_upstream_connection, refused_connect
from tests.support import proxy_client
from tests.support.proxy_policies import DOCS_HOSTS
from tests.support.proxy_stack import ProxyStack, make_sandbox

ALLOWED = [pytest.param(name, host, id=host) for name, host in DOCS_HOSTS.items() if name != "docs-apex"]


@pytest.mark.parametrize(("name", "host"), ALLOWED)
def test_wildcard_name_tunnelled(stack: ProxyStack, tmp_path: Path, name: str, host: str) -> None:
    """curl, holding only the bundle, reaches each name under the wildcard, end to end TLS."""
    bundle = stack.mint("docs")
    box = make_sandbox(bundle, tmp_path / "sandbox")
    server = stack.upstreams[name]
    before = server.connections

    ran, status, body = curl(box.env, tmp_path / "page", f"https://{host}/guide/index.html")

    assert (status, body) == (200, f"documentation from {host}/guide/index.html\n"), ran.stderr[-2000:]
    assert server.connections == before + 1
    assert server.sni[-1] == host
    lines = stack.audit(lambda x: x.get("run") == bundle["run_id"] and x.get("method") == "CONNECT")
    assert [(names_destination(x, "docs"), x.get("path"), x.get("decision")) for x in lines] == [
        (True, f"{host}:443", "allow")], lines


CONNECT_CASES = [
    pytest.param("docs.example:443", "destination_not_allowed", id="apex-not-matched"),
    pytest.param("xdocs.example:443", "destination_not_allowed", id="same-letters-no-dot"),
    pytest.param("a.docs.example.evil.test:443", "destination_not_allowed", id="wildcard-name-as-prefix"),
    pytest.param("a.docs.example:8443", "destination_port_not_allowed", id="wildcard-wrong-port"),
    pytest.param("a..docs.example:443", "destination_not_allowed", id="empty-label"),  # not a host name: no owner
]


@pytest.mark.parametrize(("target", "reason"), CONNECT_CASES)
def test_wildcard_connect_refused(stack: ProxyStack, target: str, reason: str) -> None:
    bundle = stack.mint("docs")
    with no_upstream_connection(stack):
        answer = refused_connect(stack, target, credential(stack, "run", bundle))
    assert answer.status == 403, answer.body[:500]
    assert answer.reason == reason, answer.body[:500]


@pytest.mark.parametrize(("host", "sni"), [
    pytest.param("a.docs.example", "deep.b.docs.example", id="sni-other-name-under-the-wildcard"),
    pytest.param("deep.b.docs.example", "docs.example", id="sni-apex"),
])
def test_wildcard_sni_must_be_the_connect_host(stack: ProxyStack, host: str, sni: str) -> None:
    """Both names belong to the destination, but a tunnel opened for one never carries the other."""
    bundle = stack.mint("docs")
    with no_upstream_connection(stack):
        answer, sock = proxy_client.connect(stack.proxy_address, f"{host}:443", credential(stack, "run", bundle))
        assert answer.status == 200, answer.body[:500]
        outcome = proxy_client.handshake(sock, sni)
        if outcome.sock is not None:
            with suppress(OSError):
                assert outcome.sock.recv(1) == b""
            outcome.sock.close()
        sock.close()
    lines = stack.audit(lambda x: x.get("run") == bundle["run_id"] and x.get("reason") == "sni_mismatch")
    assert lines, f"no sni_mismatch audit line; proxy log:\n{stack.log_tail()}"
