"""The egress guard: which IP address the gateway may dial for its one upstream host.

    classify(address)              -> AddressClass   one canonical IP literal; never a hostname
    check(address, allow_private)  -> EgressDecision the class, allowed or not, and the reason code
    await resolve(host, port, ...) -> PinnedTarget   hostnames go here: every answer is checked
    PinnedResolver                                   resolve in the background; ``current()`` on
                                                     the request path makes no DNS call

An address is judged by what it finally reaches: IPv4 carried inside IPv6 (mapped, compatible,
NAT64, 6to4, Teredo, ISATAP) is unwrapped first, and where several addresses are involved (Teredo
server and client, an ISATAP interface id under a real prefix) the worst of them wins. Zone ids
(``fe80::1%eth0``) are checked, kept for dialing and ignored for classification.

Only standard textual IPs are literals: ``2130706433``, ``0x7f000001``, ``017700000001`` and
``127.1`` are not addresses to ``classify`` (``dest_invalid``), and ``resolve`` refuses them too,
because the C resolver would quietly read them as 127.0.0.1.

Reason codes: dest_private_range, dest_loopback, dest_link_local, dest_metadata, dest_reserved,
dest_unspecified, dest_multicast (refused), dest_invalid (malformed), dest_unresolvable (DNS).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any, Final

from contract.errors import BadRequest, Forbidden, Reason, Unavailable, UpstreamError, ValetkeyError
from contract.tasks import stop_task

log = logging.getLogger("valetkey.gateway")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
AddrInfo = tuple[int, int, int, str, tuple[Any, ...]]
Resolver = Callable[[str, int], Awaitable[Sequence[AddrInfo]]]

RESOLVE_TIMEOUT: Final = 5.0  # seconds; getaddrinfo can otherwise hang for the resolver's full retry cycle


class AddressClass(StrEnum):
    """What an address reaches; the name is the log field and the metric label."""

    PUBLIC = "public"
    LOOPBACK = "loopback"
    PRIVATE = "private"
    LINK_LOCAL = "link_local"
    CGNAT = "cgnat"
    UNSPECIFIED = "unspecified"
    MULTICAST = "multicast"
    BROADCAST = "broadcast"
    RESERVED = "reserved"
    UNIQUE_LOCAL = "unique_local"
    SITE_LOCAL = "site_local"
    METADATA = "metadata"


class _Access(Enum):
    ALWAYS = "always"
    LOCAL = "local"  # only with allow_private (local tests, on-prem upstreams)
    NEVER = "never"


# The one policy table, worst first: the row order is the severity used when an address involves
# several (Teredo server + client). A class missing here is refused (unknown states deny).
_POLICY: Final[tuple[tuple[AddressClass, _Access, Reason], ...]] = (
    (AddressClass.METADATA, _Access.NEVER, Reason.DEST_METADATA),
    (AddressClass.UNSPECIFIED, _Access.NEVER, Reason.DEST_UNSPECIFIED),
    (AddressClass.BROADCAST, _Access.NEVER, Reason.DEST_RESERVED),
    (AddressClass.MULTICAST, _Access.NEVER, Reason.DEST_MULTICAST),
    (AddressClass.RESERVED, _Access.NEVER, Reason.DEST_RESERVED),
    # fec0::/10 was deprecated (RFC 3879): nothing legitimate lives there any more
    (AddressClass.SITE_LOCAL, _Access.NEVER, Reason.DEST_RESERVED),
    (AddressClass.LOOPBACK, _Access.LOCAL, Reason.DEST_LOOPBACK),
    (AddressClass.LINK_LOCAL, _Access.LOCAL, Reason.DEST_LINK_LOCAL),
    (AddressClass.CGNAT, _Access.LOCAL, Reason.DEST_PRIVATE_RANGE),
    (AddressClass.UNIQUE_LOCAL, _Access.LOCAL, Reason.DEST_PRIVATE_RANGE),
    (AddressClass.PRIVATE, _Access.LOCAL, Reason.DEST_PRIVATE_RANGE),
    (AddressClass.PUBLIC, _Access.ALWAYS, Reason.OK),
)
_RULES: Final = {klass: (access, reason) for klass, access, reason in _POLICY}
_SEVERITY: Final = {klass: rank for rank, (klass, _, _) in enumerate(_POLICY)}

# First match wins: metadata before link-local/CGNAT/ULA, the unspecified address before 0/8,
# broadcast before 240/4.
_RANGES: Final[tuple[tuple[AddressClass, tuple[_Network, ...]], ...]] = tuple(
    (klass, tuple(ipaddress.ip_network(net) for net in nets))
    for klass, nets in (
        # AWS/GCP/Azure IMDS, ECS task metadata, Alibaba, AWS IMDS over IPv6
        (AddressClass.METADATA, ("169.254.169.254/32", "169.254.170.2/32", "100.100.100.200/32",
                                 "fd00:ec2::254/128")),
        (AddressClass.UNSPECIFIED, ("0.0.0.0/32", "::/128")),
        (AddressClass.BROADCAST, ("255.255.255.255/32",)),
        (AddressClass.LOOPBACK, ("127.0.0.0/8", "::1/128")),
        (AddressClass.MULTICAST, ("224.0.0.0/4", "ff00::/8")),
        (AddressClass.LINK_LOCAL, ("169.254.0.0/16", "fe80::/10")),
        (AddressClass.CGNAT, ("100.64.0.0/10",)),
        # 64:ff9b:1::/48 is local-use NAT64 (RFC 8215): not globally reachable, whatever it embeds
        (AddressClass.PRIVATE, ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "64:ff9b:1::/48")),
        (AddressClass.UNIQUE_LOCAL, ("fc00::/7",)),
        (AddressClass.SITE_LOCAL, ("fec0::/10",)),
        # this network, IETF protocol assignments, documentation, 6to4 relay anycast, benchmarking,
        # future use; IPv6 discard-only, IETF protocol assignments, documentation (old and new)
        (AddressClass.RESERVED, ("0.0.0.0/8", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24",
                                 "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4",
                                 "100::/64", "2001::/23", "2001:db8::/32", "3fff::/20")),
    )
)
_GLOBAL_UNICAST_V6: Final = ipaddress.IPv6Network("2000::/3")
_NAT64_WELL_KNOWN: Final = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL_USE: Final = ipaddress.IPv6Network("64:ff9b:1::/48")
# ISATAP interface id: 0000:5efe or 0200:5efe (the u/l and i/g bits may be set) + IPv4
_ISATAP_MASK: Final = 0xFCFFFFFF
_ISATAP_ID: Final = 0x00005EFE

_ZONE_ID: Final = re.compile(r"[A-Za-z0-9_.-]{1,15}")  # an interface name (IFNAMSIZ) or index
_LABEL: Final = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME: Final = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
# WHATWG URL "ends in a number": such a host is an IPv4 address to every URL parser and to
# inet_aton, so unless it is a canonical literal it is an ambiguous one
_NUMERIC_LABEL: Final = re.compile(r"[0-9]+|0[xX][0-9A-Fa-f]*")


@dataclass(frozen=True)
class EgressDecision:
    allowed: bool
    reason: Reason
    address: str
    klass: AddressClass


@dataclass(frozen=True)
class PinnedTarget:
    """The address the gateway dials for ``host``: checked once, never resolved again on use."""

    host: str
    port: int
    address: str  # keeps a zone id (``fe80::1%eth0``): a link-local address needs it to be dialed
    family: socket.AddressFamily
    klass: AddressClass


def _parse(address: str | IPAddress) -> IPAddress:
    if isinstance(address, str):
        try:
            ip: IPAddress = ipaddress.ip_address(address)
        except ValueError as exc:
            raise BadRequest(f"{address!r} is not a canonical IP address literal",
                             Reason.DEST_INVALID) from exc
    elif isinstance(address, ipaddress.IPv4Address | ipaddress.IPv6Address):
        ip = address
    else:  # an int would be accepted by ipaddress as 2130706433 -> 127.0.0.1
        raise BadRequest(f"{type(address).__name__} is not an IP address", Reason.DEST_INVALID)
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None \
            and not _ZONE_ID.fullmatch(ip.scope_id):
        raise BadRequest("the IPv6 zone id is not an interface name or index", Reason.DEST_INVALID)
    return ip


def _unscoped(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        return ipaddress.IPv6Address(int(ip))
    return ip


def _carried(ip: ipaddress.IPv6Address) -> tuple[tuple[ipaddress.IPv4Address, ...], bool]:
    """The IPv4 addresses inside ``ip``, and whether ``ip``'s own prefix still counts.

    A pure wrapper (mapped, compatible, NAT64 well-known prefix, 6to4, Teredo) reaches only what it
    carries; a local-use NAT64 prefix and an ISATAP interface id sit under a prefix that is
    itself a destination, so both are judged.
    """
    value = int(ip)
    low32 = ipaddress.IPv4Address(value & 0xFFFFFFFF)
    if ip.ipv4_mapped is not None:
        return (ip.ipv4_mapped,), False
    if value >> 32 == 0 and value > 1:  # ::a.b.c.d, deprecated; :: and ::1 are themselves
        return (low32,), False
    if ip in _NAT64_WELL_KNOWN:
        return (low32,), False
    carried: list[ipaddress.IPv4Address] = []
    own = True
    if ip in _NAT64_LOCAL_USE:
        carried.append(low32)  # the /96 layout; the /48 itself classifies as private
    elif ip.sixtofour is not None:
        carried.append(ip.sixtofour)
        own = False
    elif ip.teredo is not None:
        carried.extend(ip.teredo)  # (server, client): the client is already un-XORed
        own = False
    if (value >> 32) & _ISATAP_MASK == _ISATAP_ID:
        carried.append(low32)
    return tuple(carried), own


def unwrap(ip: IPAddress) -> IPAddress:
    """The address ``ip`` finally reaches, scope stripped: the IPv4 inside a transition address
    (the client for Teredo), else ``ip`` itself. For logs; ``classify`` also judges the rest."""
    ip = _unscoped(ip)
    if isinstance(ip, ipaddress.IPv6Address):
        carried, _ = _carried(ip)
        if carried:
            return unwrap(carried[-1])
    return ip


def _range_class(ip: IPAddress) -> AddressClass:
    for klass, nets in _RANGES:
        if any(ip in net for net in nets):
            return klass
    if isinstance(ip, ipaddress.IPv6Address) and ip not in _GLOBAL_UNICAST_V6:
        return AddressClass.RESERVED
    # defence in depth: whatever the standard library knows to be non-global and we missed
    return AddressClass.PUBLIC if ip.is_global else AddressClass.RESERVED


def _classes(ip: IPAddress) -> list[AddressClass]:
    if isinstance(ip, ipaddress.IPv4Address):
        return [_range_class(ip)]
    carried, own = _carried(ip)
    classes = [klass for inner in carried for klass in _classes(inner)]
    if own or not carried:
        classes.append(_range_class(ip))
    return classes


def _worst(classes: Sequence[AddressClass]) -> AddressClass:
    return min(classes, key=lambda klass: _SEVERITY.get(klass, -1))


def classify(address: str | IPAddress) -> AddressClass:
    """Class of one IP literal (standard text or an ``ipaddress`` object), after unwrapping.

    Raises ``BadRequest(dest_invalid)`` for anything else, including hostnames and the legacy
    decimal/octal/hex IPv4 forms: hostnames go through ``resolve``.
    """
    return _worst(_classes(_unscoped(_parse(address))))


def _decide(ip: IPAddress, allow_private: bool) -> EgressDecision:
    klass = _worst(_classes(_unscoped(ip)))
    access, reason = _RULES.get(klass, (_Access.NEVER, Reason.DEST_RESERVED))
    allowed = access is _Access.ALWAYS or (access is _Access.LOCAL and allow_private)
    return EgressDecision(allowed, Reason.OK if allowed else reason, str(ip), klass)


def check(address: str | IPAddress, allow_private: bool) -> EgressDecision:
    """May the gateway dial ``address``? Public always; loopback, private, unique-local, CGNAT and
    link-local only with ``allow_private``; metadata, unspecified, multicast, broadcast, reserved
    and site-local never. Malformed input raises ``BadRequest(dest_invalid)``."""
    return _decide(_parse(address), allow_private)


def _literal(host: str) -> IPAddress | None:
    """``host`` as an IP literal, None for a hostname; ambiguous numeric forms are refused."""
    with contextlib.suppress(BadRequest):
        return _parse(host)
    if not _HOSTNAME.fullmatch(host) or len(host.rstrip(".")) > 253:
        raise BadRequest(f"{host!r} is neither an IP literal nor an ASCII hostname", Reason.DEST_INVALID)
    if _NUMERIC_LABEL.fullmatch(host.rstrip(".").rsplit(".", 1)[-1]):
        raise BadRequest(f"{host!r} is a non-canonical IPv4 form", Reason.DEST_INVALID)
    return None


async def _loop_getaddrinfo(host: str, port: int) -> Sequence[AddrInfo]:
    loop = asyncio.get_running_loop()
    return await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)


def _answer_address(info: AddrInfo, host: str) -> IPAddress:
    # the resolver, not the caller, produced it: refuse the destination rather than blame the request
    with contextlib.suppress(BadRequest, IndexError):
        if isinstance(info[4][0], str):
            return _parse(info[4][0])
    raise Forbidden(f"{host} resolved to something that is not an IP address", Reason.DEST_INVALID)


async def resolve(
    host: str,
    port: int,
    allow_private: bool,
    *,
    resolver: Resolver | None = None,
) -> PinnedTarget:
    """Resolve ``host`` once, check every address, and pin the first one.

    If ANY answer is refused the whole host is refused (``Forbidden`` with the reason of the
    first refused answer): a name that resolves to public and private addresses at once is how
    DNS rebinding reaches inside. Failure to resolve raises ``UpstreamError(dest_unresolvable)``;
    a malformed host or port raises ``BadRequest(dest_invalid)``. ``resolver`` is the seam for
    tests; the default is the running loop's ``getaddrinfo``.
    """
    if not 0 < port < 65536:
        raise BadRequest(f"port {port} is out of range", Reason.DEST_INVALID)
    literal = _literal(host)
    if literal is not None:
        addresses: list[IPAddress] = [literal]
    else:
        try:
            async with asyncio.timeout(RESOLVE_TIMEOUT):
                answers = await (resolver or _loop_getaddrinfo)(host, port)
        except (OSError, TimeoutError, UnicodeError) as exc:
            raise UpstreamError(f"{host} could not be resolved", Reason.DEST_UNRESOLVABLE) from exc
        addresses = list(dict.fromkeys(_answer_address(info, host) for info in answers))
        if not addresses:
            raise UpstreamError(f"{host} resolved to no address", Reason.DEST_UNRESOLVABLE)
    decisions = [_decide(ip, allow_private) for ip in addresses]
    for decision in decisions:
        if not decision.allowed:
            # the class, not the address: the detail reaches the agent and internal addresses stay inside
            raise Forbidden(f"{host} resolves to a {decision.klass} address", decision.reason,
                            address_class=decision.klass.value)
    first, ip = decisions[0], addresses[0]
    family = socket.AF_INET if isinstance(ip, ipaddress.IPv4Address) else socket.AF_INET6
    return PinnedTarget(host, port, first.address, family, first.klass)


class PinnedResolver:
    """The gateway's pinned upstream address: resolved at start, re-resolved every ``refresh``
    seconds in the background. A failed refresh keeps the last good target, for at most
    ``max_stale`` seconds after it was resolved; then ``current()`` fails closed
    (``Unavailable(dest_unresolvable)``). If the background task ever dies, the same bound holds.
    """

    def __init__(
        self,
        host: str,
        port: int,
        allow_private: bool,
        *,
        refresh: float = 30.0,
        max_stale: float = 300.0,
        resolver: Resolver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._host = host
        self._port = port
        self._allow_private = allow_private
        self._refresh = refresh
        self._max_stale = max_stale
        self._resolver = resolver
        self._clock = clock
        self._target: PinnedTarget | None = None
        self._resolved_at = 0.0
        self._task: asyncio.Task[None] | None = None

    async def load(self) -> PinnedTarget:
        """Resolve now (start-up and each refresh); raises on failure, keeping the old target."""
        target = await resolve(self._host, self._port, self._allow_private, resolver=self._resolver)
        if self._target is not None and target.address != self._target.address:
            log.info('{"event": "egress_repinned", "host": "%s", "class": "%s"}', self._host, target.klass)
        self._target = target
        self._resolved_at = self._clock()
        return target

    def current(self) -> PinnedTarget:
        """The pinned target; no DNS call. Raises ``Unavailable`` when none is fresh enough."""
        if self._target is None or self._clock() - self._resolved_at > self._max_stale:
            raise Unavailable(f"{self._host} has not resolved to an allowed address recently",
                              Reason.DEST_UNRESOLVABLE)
        return self._target

    async def start(self) -> PinnedTarget:
        target = await self.load()
        self._task = asyncio.create_task(self._run(), name=f"egress-refresh:{self._host}")
        return target

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._refresh)
            try:
                await self.load()
            except ValetkeyError as exc:
                log.warning('{"event": "egress_refresh_failed", "host": "%s", "reason": "%s"}',
                            self._host, exc.code)
