"""The egress guard: classification tables, decisions, resolution and pinning."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable
from typing import Any

import pytest

from contract.errors import BadRequest, Forbidden, Reason, Unavailable, UpstreamError
from gateways import egress
from gateways.egress import (
    AddressClass,
    AddrInfo,
    PinnedResolver,
    PinnedTarget,
    check,
    classify,
    resolve,
    unwrap,
)

C = AddressClass
R = Reason

# Teredo: 2001:0:<server v4>:<flags>:<port ^ 0xffff>:<client v4 ^ 0xffffffff>
TEREDO_CLIENT_LOOPBACK = "2001:0:4136:e378:8000:63bf:80ff:fffe"  # server 65.54.227.120, client 127.0.0.1
TEREDO_CLIENT_METADATA = "2001:0:4136:e378:8000:63bf:5601:5601"  # client 169.254.169.254
TEREDO_SERVER_PRIVATE = "2001:0:a00:1:8000:63bf:f7f7:f7f7"  # server 10.0.0.1, client 8.8.8.8


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# address, class, reason without allow_private, allowed with allow_private
CASES = [
    # loopback, plain and wrapped
    pytest.param("127.0.0.1", C.LOOPBACK, R.DEST_LOOPBACK, True, id="v4-loopback"),
    pytest.param("127.255.255.254", C.LOOPBACK, R.DEST_LOOPBACK, True, id="v4-loopback-top"),
    pytest.param("::1", C.LOOPBACK, R.DEST_LOOPBACK, True, id="v6-loopback"),
    pytest.param("::ffff:127.0.0.1", C.LOOPBACK, R.DEST_LOOPBACK, True, id="mapped-loopback"),
    pytest.param("::FFFF:7f00:1", C.LOOPBACK, R.DEST_LOOPBACK, True, id="mapped-loopback-hex"),
    pytest.param("::127.0.0.1", C.LOOPBACK, R.DEST_LOOPBACK, True, id="compatible-loopback"),
    pytest.param("64:ff9b::7f00:1", C.LOOPBACK, R.DEST_LOOPBACK, True, id="nat64-loopback"),
    pytest.param("2002:7f00:1::1", C.LOOPBACK, R.DEST_LOOPBACK, True, id="6to4-loopback"),
    pytest.param(TEREDO_CLIENT_LOOPBACK, C.LOOPBACK, R.DEST_LOOPBACK, True, id="teredo-client-loopback"),
    pytest.param("2606:4700::200:5efe:7f00:1", C.LOOPBACK, R.DEST_LOOPBACK, True, id="isatap-loopback"),
    # cloud metadata: before link-local, CGNAT and ULA, and never allowed
    pytest.param("169.254.169.254", C.METADATA, R.DEST_METADATA, False, id="imds"),
    pytest.param("169.254.170.2", C.METADATA, R.DEST_METADATA, False, id="ecs-task-metadata"),
    pytest.param("fd00:ec2::254", C.METADATA, R.DEST_METADATA, False, id="imds-v6"),
    pytest.param("fd00:ec2::254%eth0", C.METADATA, R.DEST_METADATA, False, id="imds-v6-zone"),
    pytest.param("100.100.100.200", C.METADATA, R.DEST_METADATA, False, id="alibaba-metadata"),
    pytest.param("::ffff:169.254.169.254", C.METADATA, R.DEST_METADATA, False, id="mapped-imds"),
    pytest.param("64:ff9b::a9fe:a9fe", C.METADATA, R.DEST_METADATA, False, id="nat64-imds"),
    pytest.param("2002:a9fe:a9fe::1", C.METADATA, R.DEST_METADATA, False, id="6to4-imds"),
    pytest.param(TEREDO_CLIENT_METADATA, C.METADATA, R.DEST_METADATA, False, id="teredo-client-imds"),
    pytest.param("2002:808:808::5efe:a9fe:a9fe", C.METADATA, R.DEST_METADATA, False,
                 id="isatap-in-6to4-imds"),
    # link-local
    pytest.param("fe80::1", C.LINK_LOCAL, R.DEST_LINK_LOCAL, True, id="v6-link-local"),
    pytest.param("fe80::1%eth0", C.LINK_LOCAL, R.DEST_LINK_LOCAL, True, id="v6-link-local-zone"),
    pytest.param("fe80::1%3", C.LINK_LOCAL, R.DEST_LINK_LOCAL, True, id="v6-link-local-zone-index"),
    pytest.param("169.254.1.1", C.LINK_LOCAL, R.DEST_LINK_LOCAL, True, id="v4-link-local"),
    pytest.param("fe80::5efe:808:808", C.LINK_LOCAL, R.DEST_LINK_LOCAL, True, id="isatap-link-local-prefix"),
    # CGNAT, RFC 1918, unique local, local-use NAT64
    pytest.param("100.64.0.1", C.CGNAT, R.DEST_PRIVATE_RANGE, True, id="cgnat-bottom"),
    pytest.param("100.127.255.255", C.CGNAT, R.DEST_PRIVATE_RANGE, True, id="cgnat-top"),
    pytest.param("10.0.0.1", C.PRIVATE, R.DEST_PRIVATE_RANGE, True, id="rfc1918-10"),
    pytest.param("172.16.0.1", C.PRIVATE, R.DEST_PRIVATE_RANGE, True, id="rfc1918-172-bottom"),
    pytest.param("172.31.255.255", C.PRIVATE, R.DEST_PRIVATE_RANGE, True, id="rfc1918-172-top"),
    pytest.param("192.168.1.1", C.PRIVATE, R.DEST_PRIVATE_RANGE, True, id="rfc1918-192"),
    pytest.param("64:ff9b:1::a00:1", C.PRIVATE, R.DEST_PRIVATE_RANGE, True, id="nat64-local-private"),
    pytest.param("64:ff9b:1::808:808", C.PRIVATE, R.DEST_PRIVATE_RANGE, True, id="nat64-local-public"),
    pytest.param(TEREDO_SERVER_PRIVATE, C.PRIVATE, R.DEST_PRIVATE_RANGE, True, id="teredo-server-private"),
    pytest.param("2606:4700::5efe:a00:1", C.PRIVATE, R.DEST_PRIVATE_RANGE, True, id="isatap-private"),
    pytest.param("fc00::1", C.UNIQUE_LOCAL, R.DEST_PRIVATE_RANGE, True, id="ula-fc"),
    pytest.param("fd12::1", C.UNIQUE_LOCAL, R.DEST_PRIVATE_RANGE, True, id="ula-fd"),
    # never dialed
    pytest.param("fec0::1", C.SITE_LOCAL, R.DEST_RESERVED, False, id="site-local-deprecated"),
    pytest.param("0.0.0.0", C.UNSPECIFIED, R.DEST_UNSPECIFIED, False, id="v4-unspecified"),
    pytest.param("::", C.UNSPECIFIED, R.DEST_UNSPECIFIED, False, id="v6-unspecified"),
    pytest.param("::ffff:0.0.0.0", C.UNSPECIFIED, R.DEST_UNSPECIFIED, False, id="mapped-unspecified"),
    pytest.param("224.0.0.1", C.MULTICAST, R.DEST_MULTICAST, False, id="v4-multicast"),
    pytest.param("ff02::1", C.MULTICAST, R.DEST_MULTICAST, False, id="v6-multicast"),
    pytest.param("255.255.255.255", C.BROADCAST, R.DEST_RESERVED, False, id="broadcast"),
    pytest.param("240.0.0.1", C.RESERVED, R.DEST_RESERVED, False, id="class-e"),
    pytest.param("0.1.2.3", C.RESERVED, R.DEST_RESERVED, False, id="this-network"),
    pytest.param("192.0.0.8", C.RESERVED, R.DEST_RESERVED, False, id="ietf-protocol-assignments"),
    pytest.param("192.0.2.1", C.RESERVED, R.DEST_RESERVED, False, id="test-net-1"),
    pytest.param("198.51.100.7", C.RESERVED, R.DEST_RESERVED, False, id="test-net-2"),
    pytest.param("203.0.113.9", C.RESERVED, R.DEST_RESERVED, False, id="test-net-3"),
    pytest.param("198.18.0.1", C.RESERVED, R.DEST_RESERVED, False, id="benchmarking"),
    pytest.param("2001:db8::1", C.RESERVED, R.DEST_RESERVED, False, id="v6-documentation"),
    pytest.param("3fff::1", C.RESERVED, R.DEST_RESERVED, False, id="v6-documentation-rfc9637"),
    pytest.param("100::1", C.RESERVED, R.DEST_RESERVED, False, id="v6-discard-only"),
    pytest.param("::2", C.RESERVED, R.DEST_RESERVED, False, id="compatible-this-network"),
    pytest.param("5f00::1", C.RESERVED, R.DEST_RESERVED, False, id="v6-outside-global-unicast"),
    # public
    pytest.param("8.8.8.8", C.PUBLIC, R.OK, True, id="google-dns"),
    pytest.param("1.1.1.1", C.PUBLIC, R.OK, True, id="cloudflare-dns"),
    pytest.param("140.82.112.3", C.PUBLIC, R.OK, True, id="github"),
    pytest.param("2606:4700::1111", C.PUBLIC, R.OK, True, id="cloudflare-v6"),
    pytest.param("2001:4860:4860::8888", C.PUBLIC, R.OK, True, id="google-v6"),
    pytest.param("172.32.0.1", C.PUBLIC, R.OK, True, id="just-above-172-16-12"),
    pytest.param("100.128.0.1", C.PUBLIC, R.OK, True, id="just-above-cgnat"),
    pytest.param("::ffff:8.8.8.8", C.PUBLIC, R.OK, True, id="mapped-public"),
    pytest.param("64:ff9b::808:808", C.PUBLIC, R.OK, True, id="nat64-public"),
    pytest.param("2002:808:808::1", C.PUBLIC, R.OK, True, id="6to4-public"),
]

INVALID = [
    pytest.param("2130706433", id="decimal"),
    pytest.param("0x7f000001", id="hex"),
    pytest.param("017700000001", id="octal"),
    pytest.param("010.0.0.1", id="octal-octet"),
    pytest.param("127.1", id="short-form"),
    pytest.param("", id="empty"),
    pytest.param("::ffff:", id="truncated-mapped"),
    pytest.param("1.2.3.4.5", id="five-octets"),
    pytest.param("example.com", id="hostname"),
    pytest.param(" 8.8.8.8", id="leading-space"),
    pytest.param("[::1]", id="bracketed"),
    pytest.param("1.2.3.4%eth0", id="v4-zone"),
    pytest.param("fe80::1%", id="empty-zone"),
    pytest.param("fe80::1%a b", id="zone-with-space"),
    pytest.param("fe80::1%eth0%1", id="two-zones"),
]


@pytest.mark.parametrize(("address", "klass", "reason", "local_ok"), CASES)
def test_classify_and_decide(address: str, klass: AddressClass, reason: Reason, local_ok: bool) -> None:
    assert classify(address) == klass

    strict = check(address, allow_private=False)
    assert (strict.allowed, strict.reason, strict.klass) == (reason is R.OK, reason, klass)

    local = check(address, allow_private=True)
    assert local.klass == klass
    assert (local.allowed, local.reason) == ((True, R.OK) if local_ok else (False, reason))


def test_every_class_is_in_the_table() -> None:
    assert {param.values[1] for param in CASES} == set(AddressClass)


@pytest.mark.parametrize("address", INVALID)
def test_invalid_literals_are_refused(address: str) -> None:
    for call in (classify, lambda a: check(a, allow_private=True)):
        with pytest.raises(BadRequest) as info:
            call(address)
        assert info.value.reason is R.DEST_INVALID
        assert info.value.body()["error"] == "dest_invalid"


def test_an_int_is_not_an_address() -> None:
    with pytest.raises(BadRequest) as info:
        classify(2130706433)  # type: ignore[arg-type]
    assert info.value.reason is R.DEST_INVALID


def test_address_objects_are_accepted() -> None:
    assert classify(ipaddress.ip_address("10.1.2.3")) is C.PRIVATE
    assert classify(ipaddress.IPv6Address("fe80::1%eth0")) is C.LINK_LOCAL


def test_decision_keeps_the_zone_for_dialing() -> None:
    decision = check("fe80::1%eth0", allow_private=True)
    assert decision.address == "fe80::1%eth0"
    assert (decision.allowed, decision.klass) == (True, C.LINK_LOCAL)


@pytest.mark.parametrize(
    ("address", "inner"),
    [
        pytest.param("8.8.8.8", "8.8.8.8", id="v4"),
        pytest.param("2606:4700::1111", "2606:4700::1111", id="native-v6"),
        pytest.param("fe80::1%eth0", "fe80::1", id="zone-stripped"),
        pytest.param("::ffff:127.0.0.1", "127.0.0.1", id="mapped"),
        pytest.param("::10.0.0.1", "10.0.0.1", id="compatible"),
        pytest.param("::1", "::1", id="loopback-is-not-compatible"),
        pytest.param("64:ff9b::a9fe:a9fe", "169.254.169.254", id="nat64"),
        pytest.param("64:ff9b:1::a00:1", "10.0.0.1", id="nat64-local"),
        pytest.param("2002:a9fe:a9fe::1", "169.254.169.254", id="6to4"),
        pytest.param(TEREDO_CLIENT_LOOPBACK, "127.0.0.1", id="teredo-client"),
        pytest.param("2606:4700::5efe:a00:1", "10.0.0.1", id="isatap"),
    ],
)
def test_unwrap(address: str, inner: str) -> None:
    unwrapped = unwrap(ipaddress.ip_address(address))
    assert unwrapped == ipaddress.ip_address(inner)
    assert str(unwrapped) == inner


# resolution ------------------------------------------------------------------------------------


def answer(address: str, port: int = 443) -> AddrInfo:
    if ":" in address:
        return (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0))
    return (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))


def fixed(*addresses: str) -> Callable[[str, int], Any]:
    async def resolver(host: str, port: int) -> list[AddrInfo]:
        return [answer(a, port) for a in addresses]

    return resolver


async def no_dns(host: str, port: int) -> list[AddrInfo]:
    raise AssertionError(f"an IP literal or an invalid host must not be resolved: {host}")


@pytest.mark.anyio
async def test_resolve_pins_the_first_answer() -> None:
    target = await resolve("api.example.test", 443, False, resolver=fixed("140.82.112.3", "1.1.1.1"))
    assert target == PinnedTarget("api.example.test", 443, "140.82.112.3", socket.AF_INET, C.PUBLIC)


@pytest.mark.anyio
async def test_resolve_v6_answer() -> None:
    target = await resolve("v6.example.test", 8443, False, resolver=fixed("2606:4700::1111"))
    assert (target.address, target.family, target.klass) == ("2606:4700::1111", socket.AF_INET6, C.PUBLIC)


@pytest.mark.parametrize(
    ("addresses", "reason", "klass"),
    [
        pytest.param(("140.82.112.3", "10.0.0.1"), R.DEST_PRIVATE_RANGE, "private", id="public-then-private"),
        pytest.param(("10.0.0.1", "140.82.112.3"), R.DEST_PRIVATE_RANGE, "private", id="private-then-public"),
        pytest.param(("1.1.1.1", "::ffff:127.0.0.1"), R.DEST_LOOPBACK, "loopback", id="mapped-loopback"),
        pytest.param(("1.1.1.1", "169.254.169.254", "10.0.0.1"), R.DEST_METADATA, "metadata",
                     id="first-bad-one-wins"),
    ],
)
@pytest.mark.anyio
async def test_resolve_refuses_a_mixed_answer(addresses: tuple[str, ...], reason: Reason, klass: str) -> None:
    with pytest.raises(Forbidden) as info:
        await resolve("rebind.example.test", 443, False, resolver=fixed(*addresses))
    assert info.value.reason is reason
    assert info.value.body()["address_class"] == klass
    assert "10.0.0.1" not in info.value.detail  # internal addresses are not told to the agent


@pytest.mark.anyio
async def test_allow_private_pins_private_but_never_metadata() -> None:
    target = await resolve("db.internal", 5432, True, resolver=fixed("10.0.0.5", "fd12::5"))
    assert (target.address, target.klass) == ("10.0.0.5", C.PRIVATE)
    with pytest.raises(Forbidden) as info:
        await resolve("db.internal", 5432, True, resolver=fixed("10.0.0.5", "fd00:ec2::254"))
    assert info.value.reason is R.DEST_METADATA


@pytest.mark.parametrize(
    ("host", "allow_private", "expected"),
    [
        pytest.param("140.82.112.3", False, "140.82.112.3", id="public-v4"),
        pytest.param("::1", True, "::1", id="loopback-allowed"),
        pytest.param("fe80::1%eth0", True, "fe80::1%eth0", id="zone-kept"),
    ],
)
@pytest.mark.anyio
async def test_resolve_ip_literal_makes_no_dns_call(host: str, allow_private: bool, expected: str) -> None:
    target = await resolve(host, 443, allow_private, resolver=no_dns)
    assert target.address == expected


@pytest.mark.anyio
async def test_resolve_ip_literal_is_checked() -> None:
    with pytest.raises(Forbidden) as info:
        await resolve("::ffff:169.254.169.254", 80, True, resolver=no_dns)
    assert info.value.reason is R.DEST_METADATA


@pytest.mark.parametrize(
    ("host", "port"),
    [
        pytest.param("2130706433", 443, id="decimal"),
        pytest.param("0x7f000001", 443, id="hex"),
        pytest.param("017700000001", 443, id="octal"),
        pytest.param("127.1", 443, id="short-form"),
        pytest.param("1.2.3.4.5", 443, id="five-octets"),
        pytest.param("evil.0x7f", 443, id="hex-last-label"),
        pytest.param("", 443, id="empty"),
        pytest.param("exa mple.test", 443, id="space"),
        pytest.param("a..test", 443, id="empty-label"),
        pytest.param("bücher.test", 443, id="not-punycode"),
        pytest.param("a" * 64 + ".test", 443, id="label-too-long"),
        pytest.param("api.example.test", 0, id="port-zero"),
        pytest.param("api.example.test", 65536, id="port-too-big"),
    ],
)
@pytest.mark.anyio
async def test_resolve_refuses_invalid_hosts(host: str, port: int) -> None:
    with pytest.raises(BadRequest) as info:
        await resolve(host, port, True, resolver=no_dns)
    assert info.value.reason is R.DEST_INVALID


@pytest.mark.anyio
async def test_resolve_refuses_a_non_ip_answer() -> None:
    with pytest.raises(Forbidden) as info:
        await resolve("odd.example.test", 443, True, resolver=fixed("not-an-ip"))
    assert info.value.reason is R.DEST_INVALID


async def nxdomain(host: str, port: int) -> list[AddrInfo]:
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


async def hangs(host: str, port: int) -> list[AddrInfo]:
    await asyncio.sleep(60)
    return []


@pytest.mark.parametrize(
    "resolver",
    [
        pytest.param(nxdomain, id="nxdomain"),
        pytest.param(fixed(), id="empty"),
        pytest.param(hangs, id="timeout"),
    ],
)
@pytest.mark.anyio
async def test_resolve_failure_is_unresolvable(resolver: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(egress, "RESOLVE_TIMEOUT", 0.05)
    with pytest.raises(UpstreamError) as info:
        await resolve("gone.example.test", 443, False, resolver=resolver)
    assert info.value.reason is R.DEST_UNRESOLVABLE
    assert info.value.status == 502


@pytest.mark.anyio
async def test_real_localhost_is_loopback() -> None:
    with pytest.raises(Forbidden) as info:
        await resolve("localhost", 8080, False)
    assert info.value.reason is R.DEST_LOOPBACK

    target = await resolve("localhost", 8080, True)
    assert target.address in {"127.0.0.1", "::1"}
    assert (target.host, target.port, target.klass) == ("localhost", 8080, C.LOOPBACK)
    assert target.family in {socket.AF_INET, socket.AF_INET6}


# pinning ---------------------------------------------------------------------------------------


class Upstream:
    """A switchable resolver seam and a hand-moved clock."""

    def __init__(self, *addresses: str) -> None:
        self.addresses: tuple[str, ...] = addresses
        self.failing = False
        self.calls = 0
        self.now = 1000.0

    async def resolve(self, host: str, port: int) -> list[AddrInfo]:
        self.calls += 1
        if self.failing:
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return [answer(a, port) for a in self.addresses]

    def clock(self) -> float:
        return self.now


def pinned(upstream: Upstream, **kwargs: Any) -> PinnedResolver:
    return PinnedResolver("api.example.test", 443, False, resolver=upstream.resolve, clock=upstream.clock,
                          **kwargs)


@pytest.mark.anyio
async def test_pinned_resolver_serves_the_cache_and_fails_closed_when_stale() -> None:
    upstream = Upstream("140.82.112.3")
    resolver = pinned(upstream, max_stale=300.0)
    with pytest.raises(Unavailable) as info:
        resolver.current()
    assert info.value.reason is R.DEST_UNRESOLVABLE

    await resolver.load()
    for _ in range(3):
        assert resolver.current().address == "140.82.112.3"
    assert upstream.calls == 1  # current() never resolves

    upstream.failing = True
    with pytest.raises(UpstreamError):
        await resolver.load()
    upstream.now += 299.0
    assert resolver.current().address == "140.82.112.3"  # last good target, still within max_stale

    upstream.now += 2.0
    with pytest.raises(Unavailable) as info:
        resolver.current()
    assert info.value.reason is R.DEST_UNRESOLVABLE
    assert info.value.status == 503

    upstream.failing = False
    await resolver.load()
    assert resolver.current().address == "140.82.112.3"


@pytest.mark.anyio
async def test_pinned_resolver_keeps_the_checked_target_when_dns_turns_private() -> None:
    upstream = Upstream("140.82.112.3")
    resolver = pinned(upstream)
    await resolver.load()
    upstream.addresses = ("140.82.112.3", "10.0.0.1")
    with pytest.raises(Forbidden) as info:
        await resolver.load()
    assert info.value.reason is R.DEST_PRIVATE_RANGE
    assert resolver.current().address == "140.82.112.3"


@pytest.mark.anyio
async def test_pinned_resolver_refreshes_in_the_background() -> None:
    upstream = Upstream("140.82.112.3")
    resolver = PinnedResolver("api.example.test", 443, False, refresh=0.01, resolver=upstream.resolve)
    assert (await resolver.start()).address == "140.82.112.3"
    try:
        upstream.addresses = ("140.82.112.4",)
        for _ in range(200):
            if resolver.current().address == "140.82.112.4":
                break
            await asyncio.sleep(0.01)
        assert resolver.current().address == "140.82.112.4"

        upstream.failing = True  # failures are logged, the last good target stays
        calls = upstream.calls
        for _ in range(200):
            if upstream.calls >= calls + 3:
                break
            await asyncio.sleep(0.01)
        assert upstream.calls >= calls + 3
        assert resolver.current().address == "140.82.112.4"
    finally:
        await resolver.stop()
