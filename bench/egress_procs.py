"""The processes of table 7 (the egress proxy): the local TLS upstream and bulk server, mitmproxy
as a forward proxy, and the valetkey proxy (``valetkey proxy serve``) on a bench stack of its own.
Each is a foreground child on loopback, stopped on exit. The sandbox runtime's proxy is in
``bench/srt.py``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench.testca import API_HOST, BULK_HOST, TUNNEL_HOST, TestCA
from bench.tools import Child


def wait_port(port: int, proc: subprocess.Popen[bytes], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process for port {port} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port} after {seconds}s")


class Server(Child):
    """A child ready once its port accepts (TLS servers answer no plain GET)."""

    def __enter__(self) -> Server:
        log = (self.dir / "stdout.log").open("wb")
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT,  # noqa: S603
                                     env={**os.environ, **self.env()})
        log.close()
        try:
            wait_port(self.port, self.proc)
        except RuntimeError as exc:
            self.__exit__()
            tail = (self.dir / "stdout.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.name} did not start: {exc}\n{tail}") from None
        return self


class TlsUpstream(Server):
    """``bench/upstream.py`` over TLS with the test CA's certificate for every bench name."""

    name = "tls-upstream"

    def __init__(self, ca: TestCA, secret: str, port: int = 0) -> None:
        super().__init__()
        self.port = port or self.port
        self.ca, self.secret = ca, secret

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "bench.upstream", str(self.port), self.secret, str(self.ca.cert),
                str(self.ca.key)]


class BulkServer(Server):
    name = "bulk"

    def __init__(self, ca: TestCA, port: int = 0) -> None:
        super().__init__()
        self.port = port or self.port
        self.ca = ca

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "bench.bulk", str(self.port), str(self.ca.cert), str(self.ca.key)]


MITM_FORWARD_ADDON = '''"""Inject the upstream credential for one host (mitmproxy addon, regular mode).

The bench names resolve nowhere: this process maps them to loopback itself, as the valetkey
proxy's test-only resolver map does (the name still goes into SNI, Host and the checks)."""
import os
import socket

from mitmproxy import http

HEADER = "Bearer " + os.environ["BENCH_SECRET"]
INJECT_HOST = os.environ["BENCH_INJECT_HOST"]
RESOLVE = dict(item.split("=") for item in os.environ["BENCH_RESOLVE"].split(","))
_getaddrinfo = socket.getaddrinfo


def getaddrinfo(host, *args, **kwargs):
    return _getaddrinfo(RESOLVE.get(host, host), *args, **kwargs)


socket.getaddrinfo = getaddrinfo


class Inject:
    def request(self, flow: http.HTTPFlow) -> None:
        if flow.request.host == INJECT_HOST:
            flow.request.headers["Authorization"] = HEADER


addons = [Inject()]
'''


class MitmForward(Server):
    """mitmdump in regular (forward proxy) mode: terminates every CONNECT with its own CA, except
    the tunnel names (``ignore_hosts``: passed through untouched), and injects the secret for
    ``API_HOST`` with a short addon. Upstream TLS is verified against the test CA."""

    name = "mitmproxy-forward"

    def __init__(self, binary: str, secret: str, ca: TestCA) -> None:
        super().__init__()
        self.binary, self.secret, self.test_ca = binary, secret, ca
        (self.dir / "inject.py").write_text(MITM_FORWARD_ADDON)

    @property
    def client_ca(self) -> Path:
        """What a client trusts for the terminated hosts (mitmproxy writes it at start)."""
        return self.dir / "conf" / "mitmproxy-ca-cert.pem"

    def argv(self) -> list[str]:
        ignore = "|".join(f"^{h.replace('.', '[.]')}:" for h in (TUNNEL_HOST, BULK_HOST))
        return [self.binary, "--mode", "regular", "--listen-host", "127.0.0.1",
                "--listen-port", str(self.port), "-s", str(self.dir / "inject.py"), "-q",
                "--set", f"confdir={self.dir / 'conf'}", "--set", "termlog_verbosity=error",
                "--set", "connection_strategy=lazy",
                "--set", f"ssl_verify_upstream_trusted_ca={self.test_ca.ca}",
                "--set", f"ignore_hosts={ignore}"]

    def env(self) -> dict[str, str]:
        names = ",".join(f"{h}=127.0.0.1" for h in (API_HOST, TUNNEL_HOST, BULK_HOST))
        return {"BENCH_SECRET": self.secret, "BENCH_INJECT_HOST": API_HOST, "BENCH_RESOLVE": names}

    def __enter__(self) -> MitmForward:
        super().__enter__()
        deadline = time.monotonic() + 30
        while not self.client_ca.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self
