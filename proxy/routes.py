"""Which policy entry covers a CONNECT or request target, as the proxy uses it.

    route(policies, host, port) -> Route     ``PolicySet.route`` (policies/destinations.py) with
                                             its misses raised as refusals:
        destination_ip_literal        an IP address instead of a name (any spelling)
        destination_not_allowed       no upstream or destination names the host (or not a DNS name)
        destination_port_not_allowed  a name matches, but its owner does not name the port

    unlisted(policies, runtime, host, port, refusal) -> Route
                                             a host no destination names, where the runtime's
                                             ``unlisted_hosts`` may ask about it; else ``refusal``

A credentialed upstream is always terminated (the gateway pipeline for its audience, https only);
a destination is tunnelled or terminated as its policy says, and plain http on port 80. An
unlisted host is always terminated (or plain http on port 80): the proxy must see each request to
hold it for a person.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.errors import Forbidden, Reason
from policies.destinations import Miss
from policies.model import PLAIN_HTTP_PORT, Destination, PolicySet, TlsMode, UnlistedHosts, Upstream

UNLISTED = "(unlisted)"  # the audit line's and metric's name of every unlisted host (no NAME matches it)

MISSES = {
    Miss.IP_LITERAL: ("destinations are named, never addressed: an IP literal is refused",
                      Reason.DESTINATION_IP_LITERAL),
    Miss.NOT_ALLOWED: ("no destination in policy names this host", Reason.DESTINATION_NOT_ALLOWED),
    Miss.PORT_NOT_ALLOWED: ("this host is a destination, but not on this port",
                            Reason.DESTINATION_PORT_NOT_ALLOWED),
}


@dataclass(frozen=True)
class Route:
    name: str
    host: str  # canonical: lower case, no trailing dot
    port: int
    tls: TlsMode
    upstream: Upstream | None = None
    destination: Destination | None = None
    unlisted: UnlistedHosts | None = None  # the run's runtime may ask a person about this host

    @property
    def plain(self) -> bool:
        """Plain http (no TLS at all): destinations on port 80."""
        return self.upstream is None and self.port == PLAIN_HTTP_PORT


def route(policies: PolicySet, host: str, port: int) -> Route:
    found = policies.route(host, port)
    target = found.target
    if isinstance(target, Upstream):
        if target.scheme != "https":  # a plain-http upstream is for gateways on a private network
            raise Forbidden("this upstream is not served through the proxy", Reason.DESTINATION_NOT_ALLOWED)
        return Route(target.name, found.host, port, TlsMode.TERMINATE, upstream=target)
    if isinstance(target, Destination):
        return Route(target.name, found.host, port, target.tls, destination=target)
    detail, reason = MISSES[found.miss or Miss.NOT_ALLOWED]
    raise Forbidden(detail, reason)



def unlisted(policies: PolicySet, runtime: str, host: str | None, port: int, refusal: Forbidden) -> Route:
    """``refusal`` (``route``'s) stands unless no destination names the canonical ``host`` at all
    and the runtime's ``unlisted_hosts`` asks about it on ``port``."""
    found = policies.runtimes.get(runtime)
    asks = found.unlisted if found is not None else None
    if (host is None or asks is None or refusal.code != Reason.DESTINATION_NOT_ALLOWED.value
            or not asks.asks(host, port)):
        raise refusal
    return Route(UNLISTED, host, port, TlsMode.TERMINATE, unlisted=asks)
