"""The test upstreams themselves, without the proxy: TLS for their real-looking name from the test
CA, connections counted at accept (a handshake never finished counts too), the SNI recorded, and
a wheel pip installs. A proxy test that fails should never be a broken fixture."""

from __future__ import annotations

import socket
import ssl
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import run_client
from tests.support.package_index import GREETING, MODULE, PROJECT, WHEEL_PATH, SimpleIndex, build_wheel
from tests.support.proxy_client import request
from tests.support.tls_upstreams import TestCA, TlsServer


def test_tls_upstream_serves_its_name_and_counts(tmp_path: Path) -> None:
    ca = TestCA.create(tmp_path / "ca")
    index = SimpleIndex(wheel=build_wheel(tmp_path / "wheel"))
    with TlsServer("pypi.org", index, ca) as server:
        assert server.connections == 0
        with socket.create_connection(("127.0.0.1", server.port)):
            pass  # a dial that sends nothing is still a connection
        context = ssl.create_default_context(cafile=str(ca.path))
        with socket.create_connection(("127.0.0.1", server.port)) as raw, \
                context.wrap_socket(raw, server_hostname="pypi.org") as tls:
            assert tls.selected_alpn_protocol() in (None, "http/1.1")
            answer = request(tls, "GET", f"/simple/{PROJECT}/", "pypi.org")
        assert answer.status == 200
        assert WHEEL_PATH.encode() in answer.body
        # another name does not verify against this certificate
        with socket.create_connection(("127.0.0.1", server.port)) as raw:
            try:
                context.wrap_socket(raw, server_hostname="files.pythonhosted.org").close()
                verified = True
            except ssl.SSLCertVerificationError:
                verified = False
        assert not verified
        assert server.connections == 3
        assert server.sni == ["pypi.org", "files.pythonhosted.org"]
        assert [h.path for h in index.seen] == [f"/simple/{PROJECT}/"]


@pytest.mark.slow
def test_wheel_installs(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "wheel")
    target = tmp_path / "target"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PIP_CONFIG_FILE": "/dev/null"}
    ran = run_client([sys.executable, "-m", "pip", "install", "--no-index", "--no-cache-dir",
                      "--disable-pip-version-check", "--target", str(target), str(wheel)], env)
    assert ran.returncode == 0, ran.output
    check = run_client([sys.executable, "-c", f"import {MODULE}; print({MODULE}.GREETING)"],
                       {**env, "PYTHONPATH": str(target)})
    assert check.stdout.strip() == GREETING
