"""``valetkey selftest``'s egress-proxy check, run when the bundle names a proxy (``HTTPS_PROXY``).

    8 proxy   through the proxy, a host outside the allowlist is refused (403
              destination_not_allowed) and logged (the refusal names its audit request id);
              without the run's proxy credential the proxy answers 407

A request that bypasses the proxy (check 2: ``outside_url`` fetched directly) and an outside DNS
resolver (check 3) are the other halves of "all egress goes through the proxy".
"""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit


def proxy_of(env: Mapping[str, str]) -> tuple[str, int, str] | None:
    """(host, port, run token) of the bundle's proxy, or None when it names none."""
    url = env.get("HTTPS_PROXY") or env.get("https_proxy") or ""
    if not url:
        return None
    parts = urlsplit(url)
    if not parts.hostname:
        return None
    return parts.hostname, parts.port or 80, unquote(parts.password or "")


def connect(proxy: tuple[str, int, str], authority: str, timeout: float, credential: bool = True) -> bytes:
    """Send one CONNECT; the proxy's answer (head and body), or b"" when it did not answer."""
    host, port, token = proxy
    auth = base64.b64encode(f"run:{token}".encode()).decode()
    head = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n"
    if credential:
        head += f"Proxy-Authorization: Basic {auth}\r\n"
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall((head + "\r\n").encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
                if b"\r\n\r\n" in data and data.startswith(b"HTTP/1.1 200"):
                    break
            return data
    except OSError:
        return b""


def _body(answer: bytes) -> dict[str, Any]:
    try:
        value = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    except (ValueError, IndexError):
        return {}
    return value if isinstance(value, dict) else {}


def check(env: Mapping[str, str], outside_url: str, timeout: float) -> tuple[bool, list[str]]:
    """(passed, evidence) of check 8; callers skip it when ``proxy_of`` is None."""
    proxy = proxy_of(env)
    if proxy is None:
        return False, ["the bundle names no proxy (HTTPS_PROXY)"]
    target = urlsplit(outside_url)
    authority = f"{target.hostname}:{target.port or 443}"
    passed, evidence = True, []
    answer = connect(proxy, authority, timeout)
    status = answer[9:12].decode(errors="replace")
    body = _body(answer)
    if status == "403" and body.get("error") == "destination_not_allowed" and body.get("request_id"):
        evidence.append(f"CONNECT {authority} via the proxy: refused 403 destination_not_allowed, "
                        f"logged as request {body['request_id']}")
    else:
        passed = False
        evidence.append(f"CONNECT {authority} via the proxy: not refused as outside the allowlist "
                        f"({status or 'no answer'} {body.get('error', '')})")
    answer = connect(proxy, authority, timeout, credential=False)
    if answer.startswith(b"HTTP/1.1 407"):
        evidence.append("without the run's proxy credential: 407")
    else:
        passed = False
        got = answer[9:12].decode(errors="replace") or "no answer"
        evidence.append(f"without the run's proxy credential: {got}")
    return passed, evidence
