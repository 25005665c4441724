"""The comparison proxies (nginx, mitmproxy), wrk and py-spy: found on this machine or skipped with
a reason, started as foreground children on loopback, stopped on exit.

Where they come from (``./scripts/bench`` installs them): nginx and wrk from Debian (apt-get);
mitmproxy and py-spy from PyPI into ``.venv-bench`` — a venv of their own, so mitmproxy's pinned
dependencies never touch the project's. ``VALETKEY_BENCH_MITMDUMP`` / ``VALETKEY_BENCH_PYSPY``
override where they are looked for.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.loadgen import json_body
from bench.stack import wait_http
from valetkey.dev.services import free_port

REPO = Path(__file__).resolve().parent.parent
TOOLS_VENV = REPO / ".venv-bench" / "bin"


def _skipped(tool: str) -> bool:
    """``VALETKEY_BENCH_SKIP=nginx,wrk,mitmproxy,py-spy`` (or ``all``) makes a tool count as absent:
    how the test suite checks the rows that run without them."""
    names = {n.strip() for n in os.environ.get("VALETKEY_BENCH_SKIP", "").split(",")}
    return tool in names or "all" in names


def _first(*candidates: str | Path | None) -> str | None:
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def find_nginx() -> str | None:
    if _skipped("nginx"):
        return None
    return _first(shutil.which("nginx"), "/usr/sbin/nginx")


def find_wrk() -> str | None:
    if _skipped("wrk"):
        return None
    return _first(shutil.which("wrk"))


def find_mitmdump() -> str | None:
    if _skipped("mitmproxy"):
        return None
    return _first(os.environ.get("VALETKEY_BENCH_MITMDUMP"), TOOLS_VENV / "mitmdump",
                  shutil.which("mitmdump"))


def find_pyspy() -> str | None:
    if _skipped("py-spy"):
        return None
    return _first(os.environ.get("VALETKEY_BENCH_PYSPY"), TOOLS_VENV / "py-spy",
                  Path(sys.executable).parent / "py-spy", shutil.which("py-spy"))


def version(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)  # noqa: S603
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    lines = (done.stdout + done.stderr).strip().splitlines()
    return lines[0].strip() if lines else "?"


NGINX_CONF = """daemon off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 1000000;
    upstream bench {{
        server 127.0.0.1:{upstream};
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 2m;
        client_body_buffer_size 64k;
        location / {{
            proxy_pass http://bench;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Authorization "Bearer {secret}";
            proxy_buffer_size 16k;
            proxy_buffers 8 16k;
        }}
    }}
}}
"""

MITM_ADDON = '''"""Inject the upstream credential, as valetkey's gateway does (mitmproxy addon)."""
import os

from mitmproxy import http

HEADER = "Bearer " + os.environ["BENCH_SECRET"]


class Inject:
    def request(self, flow: http.HTTPFlow) -> None:
        flow.request.headers["Authorization"] = HEADER


addons = [Inject()]
'''


class Child:
    """One foreground server process with its log in a temp dir; ``url``, ``pid``."""

    name = "child"

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"valetkey-bench-{self.name}-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} not started")
        return self.proc.pid

    def argv(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return {}

    def __enter__(self) -> Child:
        log = (self.dir / "stdout.log").open("wb")
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT,  # noqa: S603
                                     env={**os.environ, **self.env()})
        log.close()
        try:
            wait_http(f"{self.url}/v1/items/1", seconds=60, proc=self.proc)
        except RuntimeError as exc:
            self.__exit__()
            tail = (self.dir / "stdout.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.name} did not start: {exc}\n{tail}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


class Nginx(Child):
    """nginx as a reverse proxy that injects the header (one worker, keep-alive upstream)."""

    name = "nginx"

    def __init__(self, binary: str, upstream_port: int, secret: str) -> None:
        super().__init__()
        self.binary = binary
        (self.dir / "nginx.conf").write_text(
            NGINX_CONF.format(dir=self.dir, upstream=upstream_port, port=self.port, secret=secret))

    def argv(self) -> list[str]:
        return [self.binary, "-p", str(self.dir), "-c", str(self.dir / "nginx.conf"),
                "-e", str(self.dir / "error.log")]


class Mitmproxy(Child):
    """mitmdump in reverse-proxy mode with a ten-line addon that injects the header."""

    name = "mitmproxy"

    def __init__(self, binary: str, upstream_port: int, secret: str) -> None:
        super().__init__()
        self.binary = binary
        self.secret = secret
        self.upstream_port = upstream_port
        (self.dir / "inject.py").write_text(MITM_ADDON)

    def argv(self) -> list[str]:
        return [self.binary, "--mode", f"reverse:http://127.0.0.1:{self.upstream_port}",
                "--listen-host", "127.0.0.1", "--listen-port", str(self.port),
                "-s", str(self.dir / "inject.py"),
                "-q", "--set", f"confdir={self.dir / 'conf'}", "--set", "termlog_verbosity=error"]

    def env(self) -> dict[str, str]:
        return {"BENCH_SECRET": self.secret}


class Floor(Child):
    """``bench/floor.py``: the gateway's server and upstream client forwarding with no checks."""

    name = "floor"

    def __init__(self, upstream_port: int, secret: str) -> None:
        super().__init__()
        self.upstream_port = upstream_port
        self.secret = secret

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "bench.floor", str(self.port), str(self.upstream_port), self.secret]


WRK_SCRIPT = """wrk.method = "{method}"
wrk.body = {body}
{headers}
"""
_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    return float(match.group(1)) * _UNITS[match.group(2)] if match else 0.0


def wrk(binary: str, url: str, *, method: str, headers: list[tuple[str, str]], body_size: int,
        connections: int, duration: float, body: bytes | None = None) -> dict[str, Any]:
    """Closed-loop throughput: one wrk thread, ``connections`` keep-alive connections; the body
    is ``body`` or else ``body_size`` bytes of JSON. Any status outside 2xx/3xx is counted."""
    content = body if body is not None else (json_body(body_size) if body_size else b"")
    with tempfile.NamedTemporaryFile("wb", suffix=".json", delete=False) as payload:
        payload.write(content)
    body_expr = f'io.open("{payload.name}", "rb"):read("*a")' if content else '""'
    lines = [f'wrk.headers["{k}"] = "{v}"' for k, v in headers]
    if content:
        lines.append('wrk.headers["Content-Type"] = "application/json"')
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT.format(method=method, body=body_expr, headers="\n".join(lines)))
    try:
        done = subprocess.run(  # noqa: S603 - our argv
            [binary, "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "--timeout", "10s",
             "--latency", "-s", script.name, url],
            capture_output=True, text=True, timeout=duration + 60, check=False)
    finally:
        os.unlink(script.name)
        os.unlink(payload.name)
    out = done.stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if done.returncode != 0 or rps is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {out[-500:]} {done.stderr[-500:]}")
    total = re.search(r"(\d+) requests in", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    dist = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", out, re.MULTILINE))
    return {"rps": float(rps.group(1)), "requests": int(total.group(1)) if total else 0,
            "non200": int(non2xx.group(1)) if non2xx else 0,
            "errors": sum(int(n) for n in errors.groups()) if errors else 0,
            "latency_ms": {"p50": _ms(dist.get("50", "")), "p99": _ms(dist.get("99", ""))}}
