"""Which policy entry covers a CONNECT or request target: a credentialed upstream (always
terminated, the gateway pipeline for its audience) or a destination (tunnelled or terminated).

    route(policies, host, port) -> Route      raises Forbidden with the reason:
        destination_ip_literal        an IP address instead of a name
        destination_not_allowed       no upstream or destination names the host
        destination_port_not_allowed  a name matches, but none of its entries names the port

Exact names beat wildcards; an upstream beats a destination of the same name and port (load
refuses such a policy set anyway). A wildcard ``*.example.com`` covers names with one or more
labels in front of ``example.com``, never ``example.com`` itself.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from contract.errors import BadRequest, Forbidden, Reason
from policies.model import Destination, PolicySet, TlsMode, Upstream

_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_NAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")


@dataclass(frozen=True)
class Route:
    name: str
    host: str
    port: int
    tls: TlsMode
    upstream: Upstream | None = None
    destination: Destination | None = None

    @property
    def plain(self) -> bool:
        """Plain http (no TLS at all): destinations on port 80."""
        return self.upstream is None and self.port == 80


def normal_host(host: str) -> str:
    """Lower case, no trailing dot; an IP literal or a malformed name is refused."""
    host = host.strip().rstrip(".").lower()
    literal = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(literal.split("%")[0])
    except ValueError:
        pass
    else:
        raise Forbidden("destinations are named, never addressed: an IP literal is refused",
                        Reason.DESTINATION_IP_LITERAL)
    if not _NAME.match(host) or host.replace(".", "").isdigit():
        raise BadRequest("the target host is not a DNS name", Reason.INVALID_REQUEST)
    return host


def _covers(pattern: str, host: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return pattern == host


def route(policies: PolicySet, host: str, port: int) -> Route:
    host = normal_host(host)
    named = False
    for exact in (True, False):
        for upstream in policies.upstreams.values():
            if exact and upstream.host == host:
                named = True
                if upstream.port == port and upstream.scheme == "https":
                    return Route(upstream.name, host, port, TlsMode.TERMINATE, upstream=upstream)
        for dest in policies.destinations.values():
            if dest.host.startswith("*.") == exact or not _covers(dest.host, host):
                continue
            named = True
            if port in dest.ports:
                return Route(dest.name, host, port, dest.tls, destination=dest)
    if named:
        raise Forbidden(f"{host} is a destination, but not on port {port}",
                        Reason.DESTINATION_PORT_NOT_ALLOWED)
    raise Forbidden(f"no destination in policy names {host}", Reason.DESTINATION_NOT_ALLOWED)
