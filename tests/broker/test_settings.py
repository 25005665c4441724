"""Settings are read once from the environment; a bad value names its variable."""

from __future__ import annotations

import pytest

from broker.settings import BrokerSettings
from contract.env import SettingsError

BASE = {"VAULT_TOKEN": "hvs.very-secret-value", "VALETKEY_POLICY_DIR": "policies"}


def test_defaults() -> None:
    settings = BrokerSettings.from_env(BASE)
    assert (settings.host, settings.port, settings.default_ttl) == ("127.0.0.1", 8400, 900)
    assert settings.gateway_url("github") == "http://valetkey-gateway-github:8080"
    assert "very-secret" not in repr(settings)


@pytest.mark.parametrize(("extra", "named"), [
    pytest.param({"VAULT_TOKEN": ""}, "VAULT_TOKEN", id="no-token"),
    pytest.param({"VAULT_ADDR": "ftp://vault"}, "VAULT_ADDR", id="vault-scheme"),
    pytest.param({"VALETKEY_REDIS_URL": "http://redis"}, "VALETKEY_REDIS_URL", id="redis-scheme"),
    pytest.param({"VALETKEY_POLICY_DIR": "/nonexistent"}, "VALETKEY_POLICY_DIR", id="policy-dir"),
    pytest.param({"VALETKEY_LISTEN": "127.0.0.1:http"}, "VALETKEY_LISTEN", id="listen-port"),
    pytest.param({"VALETKEY_LISTEN": "127.0.0.1:70000"}, "VALETKEY_LISTEN", id="listen-range"),
    pytest.param({"VALETKEY_DEFAULT_TTL": "soon"}, "VALETKEY_DEFAULT_TTL", id="ttl"),
    pytest.param({"VALETKEY_ISSUER": "broker"}, "VALETKEY_ISSUER", id="issuer"),
    pytest.param({"VALETKEY_GATEWAY_URLS": "github"}, "VALETKEY_GATEWAY_URLS", id="gateway-urls"),
    pytest.param({"VALETKEY_GATEWAY_URLS": "github=file:///x"}, "VALETKEY_GATEWAY_URLS",
                 id="gateway-url-scheme"),
])
def test_bad_values_are_named(extra: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError) as info:
        BrokerSettings.from_env({**BASE, **extra})
    assert named in str(info.value)


@pytest.mark.parametrize("value", [
    pytest.param("localhost", id="host-only"),
    pytest.param("8400", id="port-only"),
])
def test_listen_without_host_port_names_the_form(value: str) -> None:
    with pytest.raises(SettingsError) as info:
        BrokerSettings.from_env({**BASE, "VALETKEY_LISTEN": value})
    assert str(info.value) == (f"VALETKEY_LISTEN={value!r} is not HOST:PORT "
                               "(e.g. 127.0.0.1:8400 or 0.0.0.0:8080)")


@pytest.mark.parametrize(("key", "value"), [
    pytest.param("VALETKEY_REDIS_URL", "http://:s3cret-redis-pw@redis:6379/0", id="redis-url-with-password"),
    pytest.param("VALETKEY_REDIS_URL", "s3cret-redis-pw", id="bare-secret"),
])
def test_a_bad_url_is_named_never_echoed(key: str, value: str) -> None:
    """A URL may carry a password or be a secret itself: the error names the variable, not the value."""
    with pytest.raises(SettingsError) as info:
        BrokerSettings.from_env({"VAULT_TOKEN": "s.t", key: value})
    assert key in str(info.value)
    assert "s3cret-redis-pw" not in str(info.value)
