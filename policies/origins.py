"""An upstream's ``base_url`` reduced to a bare origin: http(s) scheme, one host, a port.

Anything else a URL can carry (userinfo, path, query, fragment) is refused rather than dropped, and
the host must be a DNS name or an IP literal, so that no two URL parsers disagree about where a
credential is sent.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

# urlsplit lower-cases the host; '_' is kept for container service names such as `my_api`.
HOST_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
FIX = "write an origin such as https://api.example.com (path prefixes go in env.base_path)"


class OriginError(ValueError):
    def __init__(self, message: str, fix: str = FIX) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int

    @property
    def url(self) -> str:
        """``scheme://host[:port]``, the port only when it is not the scheme's default."""
        shown = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return f"{self.scheme}://{shown}" + ("" if self.port == default else f":{self.port}")


def parse_origin(raw: str) -> Origin:
    """Parse ``raw`` into an Origin, or raise OriginError naming the problem and its fix."""
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as exc:
        raise OriginError(f"{raw!r} is not a URL ({exc})") from exc
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise OriginError(
            "URL carries userinfo (user:password@)", "remove it; secrets come from Vault"
        )
    problem = _problem(raw, parts, port)
    if problem is not None or parts.hostname is None:
        raise OriginError(problem or "URL names no host")
    default = 443 if parts.scheme == "https" else 80
    return Origin(parts.scheme, parts.hostname, default if port is None else port)


def _problem(raw: str, parts: SplitResult, port: int | None) -> str | None:
    if parts.scheme not in ("http", "https"):
        return f"scheme {parts.scheme!r} is not http or https"
    if parts.fragment or "#" in raw:
        return "URL has a fragment"
    if parts.query or "?" in raw:
        return "URL has a query"
    if parts.path not in ("", "/"):
        return f"URL has a path {parts.path!r}"
    if not parts.hostname or not host_ok(parts.hostname):
        return f"URL must name exactly one host, got {parts.hostname!r}"
    if port == 0:
        return "URL has port 0"
    return None


def host_ok(host: str) -> bool:
    """A DNS name or IP literal: no space, '*', '\\' or other byte a parser reads otherwise."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        labels = host.split(".")
        # inet_aton and WHATWG read '0x7f.1' or '2130706433' as IPv4; only a dotted quad may be one.
        numeric = labels[-1].isdigit() or labels[-1].startswith("0x")
        return len(host) <= 253 and not numeric and all(HOST_LABEL.fullmatch(x) for x in labels)
    return True
