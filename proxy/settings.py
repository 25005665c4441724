"""Egress proxy settings: the gateway settings (Vault, Redis, broker, timeouts, bounds) read from
the same variables, plus what only the proxy has.

    VALETKEY_PROXY_LISTEN          where the sandbox's HTTP(S)_PROXY points (default 127.0.0.1:8480)
    VALETKEY_PROXY_AUDIENCE        the audience of the run's proxy credential (default ``egress``)
    VALETKEY_PROXY_CA_MOUNT        KV v2 mount of the deployment CA (default secret; paths in
                                   contract/ca.py)
    VALETKEY_PROXY_HELLO_TIMEOUT   a tunnel's ClientHello must arrive within this (default 10s)
    VALETKEY_PROXY_CA_REFRESH      how often the CA slots are read again (default 60s): a staged
                                   CA signs from its ``active_from`` on, at most this much later
    VALETKEY_PROXY_TEST_RESOLVE    TEST ONLY: ``host:port=addr:port,...`` dial addr:port for
                                   host:port (SNI, Host and certificate checks still use host;
                                   the egress guard still judges addr). Logged loudly at start.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from contract.ca import KV_MOUNT
from contract.env import SettingsError, duration
from gateways.settings import GatewaySettings

DEFAULT_LISTEN = "127.0.0.1:8480"
ConnectTo = Mapping[tuple[str, int], tuple[str, int]]


@dataclass(frozen=True)
class ProxySettings:
    gateway: GatewaySettings
    audience: str = "egress"
    ca_mount: str = KV_MOUNT
    hello_timeout: float = 10.0
    ca_refresh: float = 60.0
    connect_to: ConnectTo = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ProxySettings:
        env = dict(os.environ if env is None else env)
        env["VALETKEY_LISTEN"] = env.get("VALETKEY_PROXY_LISTEN") or DEFAULT_LISTEN
        audience = env.get("VALETKEY_PROXY_AUDIENCE", "egress")
        return cls(
            gateway=GatewaySettings.from_env(audience, env),
            audience=audience,
            ca_mount=env.get("VALETKEY_PROXY_CA_MOUNT", KV_MOUNT),
            hello_timeout=float(duration(env, "VALETKEY_PROXY_HELLO_TIMEOUT", "10s")),
            ca_refresh=float(duration(env, "VALETKEY_PROXY_CA_REFRESH", "60s")),
            connect_to=parse_connect_to(env.get("VALETKEY_PROXY_TEST_RESOLVE", "")),
        )


def parse_connect_to(value: str) -> ConnectTo:
    """``host:port=addr:port`` pairs, comma-separated; addr must be an IP literal."""
    pairs: dict[tuple[str, int], tuple[str, int]] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, sep, target = item.partition("=")
        if not sep:
            raise SettingsError(f"VALETKEY_PROXY_TEST_RESOLVE: {item!r} is not host:port=addr:port")
        host, port = _host_port(name)
        addr, dial = _host_port(target)
        try:
            ipaddress.ip_address(addr)
        except ValueError:
            raise SettingsError(f"VALETKEY_PROXY_TEST_RESOLVE: {addr!r} is not an IP address") from None
        pairs[(host.lower(), port)] = (addr, dial)
    return MappingProxyType(pairs)


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise SettingsError(f"VALETKEY_PROXY_TEST_RESOLVE: {value!r} is not host:port")
    return host.strip("[]"), int(port)
