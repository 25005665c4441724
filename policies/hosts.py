"""Host names a destination may name, and the one canonical form a requested host is judged in.

Two forms, both lower-case ASCII DNS names (IDNs in their ``xn--`` form):

* exact: ``pypi.org`` matches ``pypi.org`` only;
* wildcard: ``*.example.com`` matches any name with **one or more** labels in front of
  ``example.com`` (``a.example.com``, ``a.b.example.com``), never ``example.com`` itself, never
  ``badexample.com``. The suffix needs at least two labels (``*.com`` is refused).

IP literals (in any spelling a resolver reads as one: ``127.0.0.1``, ``[::1]``, ``2130706433``,
``0x7f.1``), a trailing dot, upper case, ``*`` anywhere else and bytes outside the DNS alphabet
are refused at load with a message saying how to write the name instead.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

MAX_HOST = 253
WILDCARD = "*."
# lower-case labels as in policies.origins.HOST_LABEL ('_' kept for container service names);
# one regex for the whole name: the proxy judges every CONNECT with it
_DNS_NAME = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)(?:\.(?!-)[a-z0-9_-]{1,63}(?<!-))*")


class HostError(ValueError):
    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


def is_ip_literal(host: str) -> bool:
    """An IP address in any form a resolver or URL parser would read as one: IPv6 (with or
    without brackets), or a name whose last label is numeric or hex (``10.0.0.1``, ``2130706433``,
    ``0x7f.1``: inet_aton and WHATWG read those as IPv4)."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if ":" in bare:  # only an IPv6 literal has one; tried first, the common names never pay for it
        try:
            ipaddress.ip_address(bare)
        except ValueError:
            pass
        else:
            return True
    last = bare.rstrip(".").rsplit(".", 1)[-1].lower()
    return bool(last) and (last.isdigit() or last.startswith("0x"))


def canonical_host(host: str) -> str | None:
    """``host`` in the form policy names are written in (lower case), or None when it is no DNS
    name a destination could name (IP literal, trailing dot, empty label, odd byte): deny."""
    lowered = host.lower()
    if not lowered.isascii() or is_ip_literal(lowered) or not _dns_name(lowered):
        return None
    return lowered


def _dns_name(host: str) -> bool:
    """Lower-case labels of letters, digits, '-' and '_' (never first or last '-'), at most 63
    each, 253 in all. IP literals are judged before (``is_ip_literal``)."""
    return len(host) <= MAX_HOST and _DNS_NAME.fullmatch(host) is not None


@dataclass(frozen=True)
class HostPattern:
    raw: str
    suffix: str  # the whole name when exact; what follows ``*.`` when a wildcard
    wildcard: bool = False

    @classmethod
    def exact(cls, host: str) -> HostPattern:
        return cls(raw=host, suffix=host)

    @classmethod
    def parse(cls, raw: str) -> HostPattern:
        """A destination's ``host``; raises HostError naming the problem and its fix."""
        if is_ip_literal(raw):
            raise HostError(f"{raw!r} is an IP literal",
                            "name the host by its DNS name; the proxy refuses CONNECT to IP literals")
        if raw != raw.lower():
            raise HostError(f"{raw!r} is not lower case", f"write `host: {raw.lower()}`")
        if raw.endswith("."):
            raise HostError(f"{raw!r} ends with a dot", f"write `host: {raw.rstrip('.')}`")
        if not raw.isascii():
            raise HostError(f"{raw!r} is not ASCII", "write the name in its xn-- (punycode) form")
        wildcard = raw.startswith(WILDCARD)
        suffix = raw[len(WILDCARD):] if wildcard else raw
        if "*" in suffix:
            raise HostError(f"{raw!r} has a '*' other than a leading '*.'",
                            "write an exact name, or `*.example.com` for every name below one")
        if not _dns_name(suffix):
            raise HostError(f"{raw!r} is not a DNS name",
                            "write a name such as pypi.org (letters, digits, '-', '_' and dots)")
        if wildcard and suffix.count(".") < 1:
            raise HostError(f"{raw!r} covers a whole top-level domain",
                            "name at least two labels after '*.', e.g. `*.example.com`")
        return cls(raw=raw, suffix=suffix, wildcard=wildcard)

    def matches(self, host: str) -> bool:
        """Does canonical ``host`` fall under this pattern?"""
        if not self.wildcard:
            return host == self.suffix
        return len(host) > len(self.suffix) + 1 and host.endswith("." + self.suffix)

    def covers(self, other: HostPattern) -> bool:
        """Does every name ``other`` matches fall under this pattern?"""
        if not other.wildcard:
            return self.matches(other.suffix)
        return self.wildcard and (other.suffix == self.suffix or other.suffix.endswith("." + self.suffix))

    def __str__(self) -> str:
        return self.raw
