"""Gateway settings: defaults a new user relies on; every bad value names its variable and the form it needs."""

from __future__ import annotations

import pytest

from contract.env import SettingsError
from gateways.settings import GatewaySettings

BASE = {"VAULT_TOKEN": "s.dev-token"}


def test_defaults() -> None:
    settings = GatewaySettings.from_env("github", BASE)
    assert (settings.host, settings.port, settings.token_leeway, settings.secret_refresh) == (
        "127.0.0.1", 8080, 5, 60)


@pytest.mark.parametrize(("extra", "message"), [
    pytest.param({"VALETKEY_LISTEN": "localhost"},
                 "VALETKEY_LISTEN='localhost' is not HOST:PORT (e.g. 127.0.0.1:8400 or 0.0.0.0:8080)",
                 id="listen-host-only"),
    pytest.param({"VALETKEY_METRICS_LISTEN": "localhost"},
                 "VALETKEY_METRICS_LISTEN='localhost' is not HOST:PORT (e.g. 127.0.0.1:8400 or 0.0.0.0:8080)",
                 id="metrics-listen-host-only"),
    pytest.param({"VALETKEY_METRICS_LISTEN": "127.0.0.1:0"}, "VALETKEY_METRICS_LISTEN: 0 is outside 1..65535",
                 id="metrics-listen-port-zero"),
    pytest.param({"VALETKEY_TOKEN_LEEWAY": "30s"}, "VALETKEY_TOKEN_LEEWAY: '30s' is not a whole number",
                 id="leeway-with-unit"),
    pytest.param({"VALETKEY_TOKEN_LEEWAY": "600"}, "VALETKEY_TOKEN_LEEWAY: 600 is outside 0..60",
                 id="leeway-too-long"),
])
def test_bad_values_name_key_and_form(extra: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as info:
        GatewaySettings.from_env("github", {**BASE, **extra})
    assert str(info.value) == message


def test_listen_accepts_ipv6_and_empty_host() -> None:
    assert GatewaySettings.from_env("github", {**BASE, "VALETKEY_LISTEN": "[::1]:9000"}).host == "::1"
    assert GatewaySettings.from_env("github", {**BASE, "VALETKEY_LISTEN": ":9000"}).host == "127.0.0.1"



def test_resilience_defaults() -> None:
    settings = GatewaySettings.from_env("echo", BASE)
    assert (settings.jwks_max_age, settings.jwks_max_stale) == (300, 900)
    assert (settings.max_connections, settings.header_timeout, settings.keepalive_timeout) == (4096, 10, 5)
    assert (settings.redis_max_connections, settings.upstream_max_connections) == (64, 256)


@pytest.mark.parametrize(("env", "named"), [
    pytest.param({"VALETKEY_JWKS_MAX_STALE": "1m", "VALETKEY_JWKS_MAX_AGE": "5m"}, "VALETKEY_JWKS_MAX_STALE",
                 id="stale-shorter-than-age"),
    pytest.param({"VALETKEY_JWKS_MAX_STALE": "soon"}, "VALETKEY_JWKS_MAX_STALE", id="stale-garbage"),
    pytest.param({"VALETKEY_MAX_CONNECTIONS": "0"}, "VALETKEY_MAX_CONNECTIONS", id="no-connections"),
    pytest.param({"VALETKEY_MAX_CONNECTIONS": "many"}, "VALETKEY_MAX_CONNECTIONS", id="connections-garbage"),
    pytest.param({"VALETKEY_HEADER_TIMEOUT": "0s"}, "VALETKEY_HEADER_TIMEOUT", id="head-timeout-zero"),
    pytest.param({"VALETKEY_KEEPALIVE_TIMEOUT": "-5s"}, "VALETKEY_KEEPALIVE_TIMEOUT", id="keepalive-negative"),
    pytest.param({"VALETKEY_REDIS_MAX_CONNECTIONS": "2"}, "VALETKEY_REDIS_MAX_CONNECTIONS", id="redis-pool-tiny"),
    pytest.param({"VALETKEY_UPSTREAM_MAX_CONNECTIONS": "0"}, "VALETKEY_UPSTREAM_MAX_CONNECTIONS",
                 id="upstream-pool-zero"),
])
def test_bad_values_name_their_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError) as info:
        GatewaySettings.from_env("echo", {**BASE, **env})
    assert str(info.value).startswith(named)
