"""The proxy's state: one set of shared parts (Vault, Redis, JWKS, revocations, audit, alerts) and
a ``Gateway`` for every host it serves, so every request runs the gateway pipeline's own steps.

- A credentialed upstream gets the same ``Gateway`` a standalone gateway process would build:
  its secret read with the proxy's Vault identity and refreshed in the background, its address
  pinned and re-resolved in the background, its audience's verifier.
- A destination host gets a ``Gateway`` with no secret of its own (``HeldSecrets``: it scans and
  redacts with every secret the proxy holds), the proxy's verifier, and its address resolved on
  the CONNECT (at most ``RESOLVE_EVERY`` old), checked by the egress guard. Wildcard destinations
  make these per host: at most ``MAX_HOSTS`` are kept, the least recently used closed first.
- A host no destination names, that a runtime may ask about (``unlisted_hosts``), gets the same
  kind of ``Gateway`` (its upstream named ``unlisted:<host>``, so an approval and its digest name
  the host), kept the same way, but never resolved here: ``proxy.steps.resolve_unlisted`` resolves
  it for each request a person approved. Keeping it remembers no decision, only connections.

Nothing here is read on the request path but memory and Redis.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from contract.ca import CA_PUBLIC_PATH, signing_slot
from contract.errors import Reason, Unavailable
from contract.secret import Secret
from contract.verify import TokenVerifier
from gateways.egress import AddressClass, AddrInfo, PinnedTarget, Resolver
from gateways.gateway import Gateway
from gateways.secret_store import SecretStore
from policies.model import Injection, Placement, PolicySet, SandboxEnv, SecretRef, TlsMode, Upstream
from proxy.certs import LeafCerts
from proxy.routes import Route
from proxy.settings import ProxySettings

log = logging.getLogger("valetkey.proxy")
RESOLVE_EVERY = 30.0  # seconds a destination host's pinned address is used before resolving again
MAX_HOSTS = 1024
# an unlisted host's Admission before any request was approved: nothing resolved, nothing to dial
NOT_RESOLVED = PinnedTarget(host="", port=0, address="", family=socket.AF_UNSPEC,
                            klass=AddressClass.UNSPECIFIED)


class HeldSecrets(SecretStore):
    """Every secret the proxy's upstream gateways hold, for scanning and redaction at
    destinations; it injects nothing (``current`` is never called on a destination)."""

    def __init__(self, stores: Sequence[SecretStore]) -> None:
        self._stores = tuple(stores)

    def __repr__(self) -> str:
        return f"HeldSecrets(stores={len(self._stores)})"

    @property
    def version(self) -> int:
        return sum(store.version for store in self._stores)

    @version.setter
    def version(self, _value: int) -> None:
        raise AttributeError("HeldSecrets.version follows its stores")

    def all_values(self) -> tuple[Secret, ...]:
        return tuple(value for store in self._stores for value in store.all_values())

    def current(self) -> Secret:
        raise RuntimeError("a destination injects no secret")

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


def map_resolver(settings: ProxySettings) -> Resolver | None:
    """The test-only resolver map as a resolver: mapped names answer their loopback address,
    others go to the system resolver."""
    if not settings.connect_to:
        return None
    mapped = settings.connect_to

    async def resolve(host: str, port: int) -> Sequence[AddrInfo]:
        target = mapped.get((host, port))
        if target is None:
            return await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family = socket.AF_INET6 if ":" in target[0] else socket.AF_INET
        return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (target[0], target[1]))]

    return resolve


def destination_upstream(route: Route) -> Upstream:
    """A destination host (or an unlisted one) seen as an upstream without a secret: the
    pipeline's steps read its host, port, scheme and purposes; the credential header it names is
    stripped, never filled. An unlisted host has no purposes of its own (the runtime's
    ``unlisted_hosts`` gives one per request) and a private address only where that allows."""
    dest = route.destination
    scheme = "http" if route.plain else "https"
    default = 80 if route.plain else 443
    name = dest.name if dest is not None else "unlisted:" + route.host + (
        "" if route.port == default else f":{route.port}")
    return Upstream(
        name=name, base_url=f"{scheme}://{route.host}:{route.port}", scheme=scheme, host=route.host,
        port=route.port, secret=SecretRef("", "", ""),
        injection=Injection(Placement.HEADER, header="authorization", format="{secret}"),
        env=SandboxEnv(placeholder="", base_url=""), purposes=dest.purposes if dest else {},
        allow_private=dest.allow_private if dest else _private(route),
    )


class Hub:
    def __init__(self, settings: ProxySettings, policies: PolicySet,
                 resolver: Resolver | None = None) -> None:
        self.settings = settings
        self.policies = policies
        self.resolver = resolver or map_resolver(settings)
        # the shared parts are those of a gateway for the proxy's own audience
        self.base = Gateway.build(settings.gateway, _proxy_upstream(settings), self.resolver,
                                  policies.alerting, policies.enterprise)
        self.verifier: TokenVerifier = self.base.verifier
        self.leaves = LeafCerts(self._read_ca, refresh=settings.ca_refresh)
        self.upstreams = {name: self._upstream_gateway(up) for name, up in policies.upstreams.items()
                          if up.scheme == "https"}
        self.held = HeldSecrets([gw.secrets for gw in self.upstreams.values()])
        self.tunnels: set[asyncio.Task[None]] = set()  # CONNECTs in progress, cancelled at stop
        self._forms: Gateway | None = None
        self._hosts: OrderedDict[tuple[str, str, int], tuple[Gateway, float]] = OrderedDict()

    def _dial_port(self, host: str, port: int) -> int | None:
        target = self.settings.connect_to.get((host, port))
        return target[1] if target else None

    def _upstream_gateway(self, upstream: Upstream) -> Gateway:
        return Gateway.build(self.settings.gateway, upstream, self.resolver, shared=self.base,
                             dial_port=self._dial_port(upstream.host, upstream.port))

    async def gateway(self, route: Route) -> Gateway:
        """The gateway for a route, its address checked by the egress guard and fresh
        (``dest_*`` refusals raise here, before the CONNECT is answered)."""
        if route.upstream is not None:
            gw = self.upstreams[route.name]
            gw.resolver.current()
            return gw
        # runtimes asking about one host may differ on private addresses: one gateway for each
        key = (route.name + ("+private" if _private(route) else ""), route.host, route.port)
        entry = self._hosts.get(key)
        if entry is not None and (route.unlisted is not None or time.monotonic() - entry[1] < RESOLVE_EVERY):
            self._hosts.move_to_end(key)
            return entry[0]
        gw = entry[0] if entry is not None else await self._destination_gateway(route)
        if route.unlisted is None:  # an unlisted host is resolved only for an approved request
            await gw.resolver.load()  # raises the egress guard's refusal; nothing is cached then
        self._hosts[key] = (gw, time.monotonic())
        self._hosts.move_to_end(key)
        while len(self._hosts) > MAX_HOSTS:
            _, (old, _) = self._hosts.popitem(last=False)
            asyncio.get_running_loop().create_task(old.client.aclose())
        return gw

    async def _destination_gateway(self, route: Route) -> Gateway:
        dest = route.destination
        gw = Gateway.build(self.settings.gateway, destination_upstream(route), self.resolver,
                           shared=self.base, dial_port=self._dial_port(route.host, route.port),
                           ca_file=dest.ca_file if dest is not None and dest.ca_file else None)
        # no secret of its own: it scans and redacts with the proxy's, and its run is the proxy token's
        await gw.vault.aclose()
        gw.secrets, gw.verifier = self.held, self.verifier
        # every destination host scans and redacts with the same secrets: compiled once
        if self._forms is None or not self._forms.redactor_is_current():
            await asyncio.to_thread(gw.redactor)
            gw.scanner()
            self._forms = gw
        else:
            gw.share_forms(self._forms)
        return gw

    def readiness(self) -> dict[str, bool]:
        """What ``/.valetkey/readyz`` reports: each part the request path relies on, fresh."""
        checks = {"ca": self.leaves.loaded, "jwks": self.base.keys.fresh,
                  "revocations": self.base.revocations.fresh}
        for name, gw in self.upstreams.items():
            checks[f"upstream:{name}"] = _ok(gw.secrets.current) and _ok(gw.resolver.current)
        return checks

    async def _read_ca(self) -> tuple[bytes, bytes]:
        """The certificate and key of the CA slot that signs now (``contract.ca.signing_slot``),
        with the proxy's identity (the base store logs in first, reading ``ca-public``'s certs)."""
        mount = self.settings.ca_mount
        await self.base.secrets.load()  # ca-public's ``certs``: logs in when due
        public, _ = await self.base.vault.kv_read_fields(mount, CA_PUBLIC_PATH)
        slots = {"slots": public["slots"].reveal()} if "slots" in public else {}
        ca, _ = await self.base.vault.kv_read_fields(mount, signing_slot(slots, time.time()))
        if "cert" not in ca or "key" not in ca:
            raise Unavailable("the signing CA slot has no cert and key", Reason.PROXY_CA_UNAVAILABLE)
        return ca["cert"].reveal().encode(), ca["key"].reveal().encode()

    async def start(self) -> None:
        if self.settings.connect_to:
            log.warning('{"event": "proxy_test_resolver", "detail": "VALETKEY_PROXY_TEST_RESOLVE is set: '
                        'names are dialled at fixed addresses; never use this outside tests", "names": %d}',
                        len(self.settings.connect_to))
        await self.base.start_shared(upstreams=1 + len(self.upstreams))  # the proxy's entry dials nothing
        await self.leaves.start()
        for gw in self.upstreams.values():
            await gw.start_own()  # its secret or run-scoped credential source, forms, address
        # leaves for the names known now are minted before the first CONNECT, off the event loop
        names = [up.host for up in self.policies.upstreams.values() if up.scheme == "https"]
        names += [d.host.raw for d in self.policies.destinations.values()
                  if d.tls is TlsMode.TERMINATE and not d.host.wildcard]
        for name in names:
            await asyncio.to_thread(self.leaves.context, name)

    async def stop(self) -> None:
        for task in list(self.tunnels):
            task.cancel()
        await asyncio.gather(*self.tunnels, return_exceptions=True)
        for gw in self.upstreams.values():
            await gw.stop_own()
            await gw.client.aclose()
            await gw.vault.aclose()
        for gw, _ in self._hosts.values():
            await gw.budgets.close()
            await gw.client.aclose()
        await self.leaves.stop()
        await self.base.stop()  # its resolver and secret store never started: stopping them is a no-op


def _proxy_upstream(settings: ProxySettings) -> Upstream:
    """The proxy's own entry for ``Gateway.build``: its audience; no host is dialled for it."""
    return Upstream(
        name=settings.audience, base_url="https://egress.invalid", scheme="https", host="egress.invalid",
        port=443,
        secret=SecretRef(settings.ca_mount, CA_PUBLIC_PATH, "certs"),
        injection=Injection(Placement.HEADER, header="proxy-authorization", format="Basic {secret}"),
        env=SandboxEnv(placeholder="", base_url=""), purposes={},
    )


def _private(route: Route) -> bool:
    return route.unlisted is not None and route.unlisted.allow_private


def _ok(check: Callable[[], object]) -> bool:
    try:
        check()
    except Exception:
        return False
    return True
