"""Two replicas of the egress proxy side by side (stateless: state in Redis, secrets from Vault).

A second ``valetkey proxy serve`` process starts with the first one's environment and another
port. One run's credential works through either; the leaves both mint chain to the one deployment
CA in the bundle; each replica's audit lines name the run; and a revocation recorded once (at the
broker) is obeyed by both: new CONNECTs refused with ``token_revoked`` and a tunnel already open on
the replica that never saw the revocation request ended within the revocation bound.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.proxy.conftest import names_destination, sandbox_for
from tests.e2e.proxy.test_proxy_refusals import REALM, credential
from tests.support import proxy_client
from tests.support.package_index import PROJECT, WHEEL_PATH
from tests.support.proxy_stack import ProxyStack, Sandbox, start_proxy
from valetkey.dev.services import free_port

REVOCATION_WAIT = 10.0
REPO_API = "https://api.github.com/repos/acme/widgets"


@pytest.fixture(scope="module")
def second(stack: ProxyStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A second replica: the first one's environment, another port."""
    port = free_port()
    env = {**stack.proxy_env, "VALETKEY_PROXY_LISTEN": f"127.0.0.1:{port}"}
    with start_proxy(env, port, tmp_path_factory.mktemp("replica") / "proxy.log"):
        yield "127.0.0.1", port


def through(box: Sandbox, address: tuple[str, int]) -> httpx.Client:
    """An httpx client using the bundle's credential and CA against the replica at ``address``."""
    proxy = box.env["HTTPS_PROXY"].rsplit("@", 1)[0] + f"@{address[0]}:{address[1]}"
    context = ssl.create_default_context(cafile=box.env["SSL_CERT_FILE"])
    return httpx.Client(proxy=proxy, verify=context, trust_env=False, timeout=20)


def test_one_run_through_either_replica(stack: ProxyStack, second: tuple[str, int], tmp_path: Path) -> None:
    bundle, box = sandbox_for(stack, tmp_path, "github", "pypi")
    github, secret = stack.upstreams["github"], stack.secret("github")
    before = len(github.app.seen)
    placeholder = {"Authorization": f"Bearer {bundle['env']['GITHUB_TOKEN']}"}
    answers = []
    for address in (stack.proxy_address, second):
        with through(box, address) as http:
            answers.append(http.get(REPO_API, headers=placeholder))
            answers.append(http.get(f"https://pypi.org/simple/{PROJECT}/"))
    assert [a.status_code for a in answers] == [200, 200, 200, 200], [a.text[:200] for a in answers]
    assert all(WHEEL_PATH in a.text for a in answers[1::2])
    # both replicas injected the one secret, read with the proxy's own identity
    assert [hit.header("authorization") for hit in github.app.seen[before:]] == [[f"Bearer {secret}"]] * 2
    request_ids = {a.headers.get("x-valetkey-request-id") for a in answers}
    lines = stack.audit(lambda x: x.get("request_id") in request_ids and x["_kind"] == "request", count=4)
    assert len(lines) == 4, lines
    assert {x.get("run") for x in lines} == {bundle["run_id"]}, lines
    assert sum(names_destination(x, "github") for x in lines) == 2


def test_revocation_reaches_both_replicas(stack: ProxyStack, second: tuple[str, int]) -> None:
    bundle = stack.mint("pythonhosted", "pypi")
    token = credential(stack, "run", bundle)
    # a tunnel open on the second replica, TLS end to end with the file host
    answer, sock = proxy_client.connect(second, "files.pythonhosted.org:443", token)
    assert answer.status == 200, answer.body[:500]
    outcome = proxy_client.handshake(sock, "files.pythonhosted.org", cafile=str(stack.ca.path))
    assert outcome.sock is not None, outcome.error
    tls = outcome.sock

    stack.revoke(bundle["run_id"])  # recorded once, at the broker

    # the open tunnel ends: the replica's watcher closes it (read returns EOF or the socket errors)
    tls.settimeout(REVOCATION_WAIT)
    started = time.monotonic()
    try:
        ended = tls.recv(1) == b""
    except (ssl.SSLError, OSError):
        ended = True
    finally:
        tls.close()
    assert ended, "the open tunnel outlived the revocation"
    assert time.monotonic() - started < REVOCATION_WAIT
    # ended by the revocation (not by the upstream's idle timeout): the tunnel's line says so
    [line] = stack.audit(lambda x: x.get("run") == bundle["run_id"] and x.get("method") == "CONNECT")
    assert (line.get("decision"), line.get("reason")) == ("deny", "token_revoked"), line

    for address in (stack.proxy_address, second):
        deadline = time.monotonic() + REVOCATION_WAIT
        while (refused := refused_connect_at(address, token)).status == 200:
            assert time.monotonic() < deadline, f"replica {address} still accepts a revoked run"
            time.sleep(0.1)
        assert (refused.status, refused.reason) == (407, "token_revoked"), refused.body[:500]
        assert refused.header("proxy-authenticate") == [REALM]


def refused_connect_at(address: tuple[str, int], token: str | None) -> proxy_client.Answer:
    answer, sock = proxy_client.connect(address, "pypi.org:443", token)
    sock.close()
    return answer
