"""``valetkey selftest``: test the sandbox boundary before relying on it.

Run inside the sandbox with a throwaway run bundle in the environment (it ends that run). Each
check reports what it observed as evidence; any failure exits non-zero. The checks that depend
on the sandbox's own network rules (1, 3, 4) only report what this process could reach.

    1 bypass        the upstream hosts behind the gateways are unreachable directly
    2 outside host  a host outside the allowlist is unreachable, and the gateway refuses it (logged)
    3 outside DNS   a resolver outside the sandbox does not answer
    4 private nets  private, loopback and link-local addresses (169.254.169.254…) are unreachable
    5 credentials   environment and usual credential files hold no long-lived credential
    6 alert         a burst of denied requests raises an alert that reaches the receiver
    7 placeholder   a placeholder is useless at any other gateway, and after the run ends
    8 proxy         (when the bundle names an egress proxy) an outside host is refused there, logged,
                    and the proxy wants the run's credential (``valetkey/selftest_proxy.py``)
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import httpx

from gateways.credential_scan import CredentialScanner
from valetkey import selftest_proxy

DEFAULT_PROBES = ("169.254.169.254:80", "[fd00:ec2::254]:80", "100.100.100.200:80", "127.0.0.1:22",
                  "127.0.0.1:80", "127.0.0.1:6379", "127.0.0.1:8200", "[::1]:80", "10.0.0.1:80",
                  "172.16.0.1:80", "192.168.0.1:80")
DEFAULT_RESOLVERS = ("8.8.8.8:53", "1.1.1.1:53")
CREDENTIAL_FILES = ("~/.netrc", "~/.git-credentials", "~/.config/gh/hosts.yml", "~/.aws/credentials",
                    "~/.aws/config", "~/.config/gcloud/application_default_credentials.json",
                    "~/.azure/accessTokens.json", "~/.docker/config.json", "~/.npmrc", "~/.pypirc",
                    "~/.config/hub", ".env", ".env.local")
BURST = 12


@dataclass
class Result:
    number: int
    name: str
    passed: bool
    evidence: list[str] = field(default_factory=list)


@dataclass
class Options:
    env: Mapping[str, str]
    probes: tuple[str, ...] = DEFAULT_PROBES
    resolvers: tuple[str, ...] = DEFAULT_RESOLVERS
    outside_url: str = "http://example.com/"
    alert_check_url: str = ""
    workspace: Path = field(default_factory=Path.cwd)
    home: Path = field(default_factory=Path.home)
    timeout: float = 2.0


@dataclass
class Gateway:
    name: str
    url: str
    info: dict[str, Any]
    token: str

    def auth(self, token: str | None = None) -> tuple[dict[str, str], dict[str, str], Any]:
        """(headers, params, basic auth) carrying ``token`` where this gateway expects it."""
        value = token or self.token
        placement = self.info["placement"]
        if placement == "basic":
            return {}, {}, ("x-access-token", value)
        if placement == "query":
            return {}, {self.info["query_param"]: value}, None
        header = self.info["header"] or "authorization"
        return {header: self.info["format"].replace("{secret}", value)}, {}, None


def _call(client: httpx.Client, gw: Gateway, method: str, path: str, token: str | None = None,
          via: Gateway | None = None) -> httpx.Response:
    """Send ``token`` (default: the gateway's own placeholder) the way ``via`` expects it."""
    target = via or gw
    headers, params, auth = target.auth(token or gw.token)
    return client.request(method, f"{target.url}{path}", headers=headers, params=params, auth=auth)


def host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def _try_connect(target: str, timeout: float) -> str | None:
    """None when the connection failed; else a description of what answered."""
    host, port = host_port(target)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return f"{target}: TCP connection accepted"
    except OSError:
        return None


def discover(opts: Options, client: httpx.Client) -> tuple[list[Gateway], list[str]]:
    gateways, notes = [], []
    for item in filter(None, opts.env.get("VALETKEY_GATEWAYS", "").split(",")):
        name, _, url = item.partition("=")
        try:
            info = client.get(f"{url}/.valetkey/info").json()
        except (httpx.HTTPError, ValueError) as exc:
            notes.append(f"gateway {name} at {url} unreachable: {type(exc).__name__}")
            continue
        token = opts.env.get(info["env"]["placeholder"], "")
        gateways.append(Gateway(name, url, info, token))
    return gateways, notes


def check_bypass(opts: Options, gateways: list[Gateway], client: httpx.Client) -> Result:
    result = Result(1, "bypass the gateway to the upstream host", True)
    for gw in gateways:
        base = gw.info["base_url"]
        try:
            response = client.get(base)
            result.passed = False
            result.evidence.append(f"{base}: reachable directly (HTTP {response.status_code})")
        except httpx.HTTPError as exc:
            result.evidence.append(f"{base}: unreachable ({type(exc).__name__})")
    if not gateways and selftest_proxy.proxy_of(opts.env) is not None:
        result.evidence.append("no gateway in VALETKEY_GATEWAYS: egress is through the proxy only")
    elif not gateways:
        result.passed = False
        result.evidence.append("no gateway found in VALETKEY_GATEWAYS")
    return result


def check_outside_host(opts: Options, gateways: list[Gateway], client: httpx.Client) -> Result:
    result = Result(2, "a host outside the allowlist", True)
    try:
        response = client.get(opts.outside_url)
        result.passed = False
        result.evidence.append(f"{opts.outside_url}: reachable directly (HTTP {response.status_code})")
    except httpx.HTTPError as exc:
        result.evidence.append(f"{opts.outside_url}: unreachable ({type(exc).__name__})")
    if gateways:
        gw = gateways[0]
        target = urlsplit(opts.outside_url)
        parts = urlsplit(gw.url)
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
        raw = f"GET {opts.outside_url} HTTP/1.1\r\nHost: {target.netloc}\r\nConnection: close\r\n\r\n"
        answer = _raw(host, port, raw.encode(), opts.timeout)
        head = answer.split(b"\r\n", 1)[0].decode(errors="replace")
        request_id = _header(answer, b"x-valetkey-request-id")
        if head.startswith(("HTTP/1.1 4", "HTTP/1.0 4")) and request_id:
            reason = _json_field(answer, "error")
            result.evidence.append(f"via gateway {gw.name}: refused {head[9:12]} {reason}, logged as "
                                   f"request {request_id}")
        else:
            result.passed = False
            result.evidence.append(f"via gateway {gw.name}: not refused ({head or 'no answer'})")
    return result


def check_dns(opts: Options) -> Result:
    result = Result(3, "DNS through an outside resolver", True)
    for target in opts.resolvers:
        host, port = host_port(target)
        query_id = secrets.randbits(16)
        packet = struct.pack(">HHHHHH", query_id, 0x0100, 1, 0, 0, 0)
        labels = b"".join(bytes([len(p)]) + p.encode() for p in ("example", "com"))
        packet += labels + b"\x00\x00\x01\x00\x01"  # root, type A, class IN
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.settimeout(opts.timeout)
            try:
                sock.sendto(packet, (host, port))
                data, _ = sock.recvfrom(512)
            except OSError as exc:
                result.evidence.append(f"{target}: no answer ({type(exc).__name__})")
                continue
        if len(data) >= 2 and struct.unpack(">H", data[:2])[0] == query_id:
            result.passed = False
            result.evidence.append(f"{target}: answered a DNS query ({len(data)} bytes)")
        else:
            result.evidence.append(f"{target}: no DNS answer")
    return result


def check_private(opts: Options) -> Result:
    result = Result(4, "private, loopback, link-local addresses", True)
    for target in opts.probes:
        answered = _try_connect(target, opts.timeout)
        if answered:
            result.passed = False
            result.evidence.append(answered)
        else:
            result.evidence.append(f"{target}: unreachable")
    return result


def check_credentials(opts: Options) -> Result:
    result = Result(5, "no long-lived credential in env or files", True)
    scanner = CredentialScanner()
    for name, value in sorted(opts.env.items()):
        found = scanner.find(value)
        if found is not None:
            result.passed = False
            result.evidence.append(f"env {name}: looks like {found.provider} ({found.name})")
    checked = 0
    for pattern in CREDENTIAL_FILES:
        path = (opts.home / pattern[2:]) if pattern.startswith("~/") else (opts.workspace / pattern)
        if not path.is_file():
            continue
        checked += 1
        try:
            data = path.read_bytes()[:1024 * 1024]
        except OSError as exc:
            result.evidence.append(f"{path}: unreadable ({type(exc).__name__})")
            continue
        found = scanner.find(data)
        if found is not None:
            result.passed = False
            result.evidence.append(f"{path}: holds a {found.provider} credential ({found.name})")
        elif pattern.endswith((".netrc", ".git-credentials", "credentials", "hosts.yml")):
            result.passed = False
            result.evidence.append(f"{path}: a credential file is present")
    if result.passed:
        result.evidence.append(f"clean: {len(opts.env)} environment variables, {checked} credential files")
    return result


def check_alert(opts: Options, gateways: list[Gateway], client: httpx.Client, run_id: str) -> Result:
    result = Result(6, "a burst of denials raises an alert", False)
    if not gateways:
        result.evidence.append("no gateway to send denied requests to")
        return result
    gw = gateways[0]
    codes = set()
    for n in range(BURST):
        response = _call(client, gw, "GET", f"/.valetkey-selftest/denied/{n}")
        codes.add(f"{response.status_code} {_safe_json(response).get('error')}")
    result.evidence.append(f"sent {BURST} denied requests to {gw.name}: {', '.join(sorted(codes))}")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not result.passed:
        if opts.alert_check_url:
            alerts = _safe_json(client.get(opts.alert_check_url)).get("alerts", [])
            hits = [a for a in alerts if a.get("run") == run_id]
            if hits:
                result.passed = True
                kinds = sorted({str(a.get("alert", "?")) for a in hits})
                result.evidence.append(f"receiver got: {', '.join(kinds)}")
        else:
            if _safe_json(_call(client, gw, "GET", "/")).get("error") == "token_revoked":
                result.passed = True
                result.evidence.append("the alert fired: the run was revoked automatically")
        time.sleep(0.2)
    if not result.passed:
        result.evidence.append("no alert observed within 10s")
    return result


def check_placeholder(
    opts: Options, gateways: list[Gateway], client: httpx.Client
) -> tuple[Result, Callable[[], Result]]:
    result = Result(7, "placeholder useless elsewhere and after the run", True)
    for gw in gateways:
        for other in gateways:
            if other is gw:
                continue
            code = _safe_json(_call(client, gw, "GET", "/", via=other)).get("error")
            ok = code == "audience_mismatch"
            result.passed &= ok
            result.evidence.append(f"{gw.name}'s placeholder at {other.name}: {code}")
    if len(gateways) < 2:
        result.evidence.append("one gateway only: no other audience to try")

    def after_end() -> Result:
        for gw in gateways:
            _call(client, gw, "POST", "/.valetkey/end-run")
        for gw in gateways:
            code = _safe_json(_call(client, gw, "GET", "/")).get("error")
            result.passed &= code == "token_revoked"
            result.evidence.append(f"after the run ended, {gw.name}: {code}")
        return result

    return result, after_end


def run(opts: Options) -> list[Result]:
    with httpx.Client(timeout=opts.timeout, trust_env=False) as client:
        gateways, notes = discover(opts, client)
        run_id = opts.env.get("VALETKEY_RUN_ID", "")
        results = [check_bypass(opts, gateways, client), check_outside_host(opts, gateways, client),
                   check_dns(opts), check_private(opts), check_credentials(opts)]
        _, after_end = check_placeholder(opts, gateways, client)
        if selftest_proxy.proxy_of(opts.env) is not None:  # before the run ends: its credential works
            passed, evidence = selftest_proxy.check(opts.env, opts.outside_url, opts.timeout)
            proxy_result = Result(8, "egress proxy: outside host refused and logged", passed, evidence)
        results.append(check_alert(opts, gateways, client, run_id))
        results.append(after_end())
        if selftest_proxy.proxy_of(opts.env) is not None:
            results.append(proxy_result)
        if notes:
            results[0].evidence.extend(notes)
    return results


def render(results: list[Result]) -> str:
    lines = [f"{'#':<2} {'check':<50} {'result':<6} evidence"]
    for r in results:
        first, *rest = r.evidence or [""]
        lines.append(f"{r.number:<2} {r.name:<50} {'PASS' if r.passed else 'FAIL':<6} {first}")
        lines += [f"{'':<60} {line}" for line in rest]
    passed = sum(r.passed for r in results)
    lines.append(f"{passed} passed, {len(results) - passed} failed")
    return "\n".join(lines)


def as_json(results: list[Result]) -> str:
    return json.dumps([asdict(r) for r in results], indent=2)


def _raw(host: str, port: int, request: bytes, timeout: float) -> bytes:
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(request)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            return data
    except OSError:
        return b""


def _header(answer: bytes, name: bytes) -> str:
    head = answer.split(b"\r\n\r\n", 1)[0]
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip().decode(errors="replace")
    return ""


def _json_field(answer: bytes, key: str) -> str:
    try:
        return str(json.loads(answer.split(b"\r\n\r\n", 1)[1]).get(key, ""))
    except (ValueError, IndexError, AttributeError):
        return ""


def _safe_json(response: httpx.Response) -> dict[str, Any]:
    try:
        value = response.json()
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def env_from_file(path: Path) -> dict[str, str]:
    import shlex

    env = dict(os.environ)
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = " ".join(shlex.split(value)) if value.strip() else ""
    return env


@click.command("selftest")
@click.option("--env-file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="the run bundle as KEY=value lines [default: this process's environment]")
@click.option("--probe", "probes", multiple=True, help="HOST:PORT that must be unreachable (repeatable)")
@click.option("--resolver", "resolvers", multiple=True, help="outside DNS resolver HOST:PORT (repeatable)")
@click.option("--outside-url", default="http://example.com/", show_default=True,
              help="a URL outside the allowlist")
@click.option("--alert-check-url", default="", help="where the alert receiver lists what it got (JSON)")
@click.option("--timeout", default=2.0, show_default=True, help="Seconds each probe may take.")
@click.option("--json", "as_json_out", is_flag=True, help="Machine-readable JSON output.")
def selftest_command(env_file: Path | None, probes: tuple[str, ...], resolvers: tuple[str, ...],
                     outside_url: str, alert_check_url: str, timeout: float, as_json_out: bool) -> None:
    """Test the sandbox boundary (run inside it, with a throwaway run bundle: it ends that run)."""
    import sys

    env = env_from_file(env_file) if env_file else dict(os.environ)
    opts = Options(env=env, probes=probes or DEFAULT_PROBES, resolvers=resolvers or DEFAULT_RESOLVERS,
                   outside_url=outside_url, alert_check_url=alert_check_url, timeout=timeout)
    results = run(opts)
    click.echo(as_json(results) if as_json_out else render(results))
    sys.exit(0 if all(r.passed for r in results) else 1)
