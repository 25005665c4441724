"""The proxy of Anthropic's sandbox runtime (``@anthropic-ai/sandbox-runtime``, npm) in table 7.

Where it comes from: ``./scripts/bench`` runs ``npm install`` into ``.bench-node/`` (never at
install or test time, never committed); ``VALETKEY_BENCH_SRT`` names another installed copy.

How it runs here (read from the package's source, ``dist/sandbox/``): its public entry point,
``SandboxManager.initialize()``, starts the proxy only after a dependency check for the sandbox
itself (on Linux: bubblewrap, socat and ripgrep, and a uid-0 user-namespace probe); the proxy
does not need them, but the check refuses to go on without them. So ``bench/srt_proxy.mjs``
first calls ``initialize()`` and records its refusal verbatim, then starts the proxy from the
package's own modules the way ``SandboxManager`` wires them (``startMuxProxyServer``): the
single HTTP+SOCKS port (``createMuxProxyServer``), the HTTP/CONNECT proxy
(``createHttpProxyServer``) with an allowlist filter and a ``Proxy-Authorization`` token, TLS
termination with an ephemeral MITM CA (``createMitmCA``; RSA-2048 leaves by node-forge), and
header injection by its ``SentinelRegistry`` (the client holds a ``fake_value_…`` sentinel,
the upstream receives the secret). Tunnel-mode hosts are listed as never terminated
(``tlsTerminate.excludeDomains``), so they are opaque CONNECT tunnels.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import statistics
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "@anthropic-ai/sandbox-runtime"
INSTALLED = REPO / ".bench-node" / "node_modules" / PACKAGE
LAUNCHER = REPO / "bench" / "srt_proxy.mjs"


def find_srt() -> Path | None:
    """The installed package directory, or None (``VALETKEY_BENCH_SKIP=srt`` counts as absent)."""
    names = {n.strip() for n in os.environ.get("VALETKEY_BENCH_SKIP", "").split(",")}
    if "srt" in names or "all" in names or shutil.which("node") is None:
        return None
    for candidate in (os.environ.get("VALETKEY_BENCH_SRT"), INSTALLED):
        if candidate and (Path(candidate) / "dist" / "sandbox" / "http-proxy.js").is_file():
            return Path(candidate)
    return None


def srt_version(package: Path) -> str:
    try:
        return str(json.loads((package / "package.json").read_text())["version"])
    except (OSError, ValueError, KeyError):
        return "?"


class SrtProxy:
    """``node bench/srt_proxy.mjs serve``: ``port``, ``client_ca`` (its MITM CA), ``sentinel`` (what
    the client sends for the secret), ``proxy_auth`` (a Proxy-Authorization value), ``manager_error``."""

    def __init__(self, package: Path, *, allowed: list[str], resolve: dict[str, str], tunnel: list[str],
                 inject_host: str, secret: str, upstream_ca: Path) -> None:
        self.config = {"package": str(package), "allowed": allowed, "resolve": resolve, "tunnel": tunnel,
                       "inject_host": inject_host, "secret": secret}
        self.upstream_ca = upstream_ca
        self.proc: subprocess.Popen[str] | None = None
        self.info: dict[str, Any] = {}

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("srt proxy not started")
        return self.proc.pid

    def __enter__(self) -> SrtProxy:
        # upstream TLS is verified against Node's store plus NODE_EXTRA_CA_CERTS, as under SandboxManager
        env = {**os.environ, "NODE_EXTRA_CA_CERTS": str(self.upstream_ca)}
        self.proc = subprocess.Popen(["node", str(LAUNCHER), "serve", json.dumps(self.config)],  # noqa: S603, S607
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.strip():
            err = self.proc.stderr.read()[-1500:] if self.proc.stderr else ""
            self.__exit__()
            raise RuntimeError(f"the sandbox runtime's proxy did not start: {err}")
        self.info = json.loads(line)
        return self

    @property
    def port(self) -> int:
        return int(self.info["port"])

    @property
    def client_ca(self) -> str:
        return str(self.info["ca"])

    @property
    def sentinel(self) -> str:
        return str(self.info["sentinel"])

    @property
    def proxy_auth(self) -> str:
        return "Basic " + base64.b64encode(f"run:{self.info['proxy_auth']}".encode()).decode()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def srt_mint(package: Path, count: int) -> dict[str, Any]:
    """The sandbox runtime's own leaf mint (``mintLeafCert``): ``count`` new hosts, then a cached one."""
    argv = ["node", str(LAUNCHER), "mint", json.dumps({"package": str(package), "count": count})]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60 + 30 * count,  # noqa: S603
                          check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-400:]}
    raw = json.loads(done.stdout)
    return {"fresh_ms": round(statistics.median(raw["fresh_ms"]), 3),
            "fresh_max_ms": round(max(raw["fresh_ms"]), 3),
            "cached_ms": round(statistics.median(raw["cached_ms"]), 5), "count": count, "key": raw["key"]}
