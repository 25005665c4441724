"""Gateway settings: read once, every bad value names its variable."""

from __future__ import annotations

import pytest

from broker.settings import SettingsError
from gateways.settings import GatewaySettings

BASE = {"VAULT_TOKEN": "dev-only"}


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
