"""Reading settings from the environment: every bad value raises ``SettingsError`` naming its key.

Shared by the broker's and the gateways' settings; each reads its variables once at start-up into
a frozen object.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from contract import redis_url
from policies.units import parse_duration


class SettingsError(ValueError):
    """A setting has a bad value; the message names the environment variable."""


def required(env: Mapping[str, str], key: str) -> str:
    value = env.get(key, "")
    if not value:
        raise SettingsError(f"{key} must be set")
    return value


def checked_url(key: str, value: str, schemes: tuple[str, ...] = ("http", "https")) -> str:
    parts = urlsplit(value)
    if parts.scheme not in schemes or (parts.scheme != "unix" and not parts.hostname):
        # never the value itself: a URL may carry a password (redis://:pw@…) or be a secret
        # (a webhook URL); its scheme is enough to see what is wrong
        shown = f"scheme {parts.scheme!r}" if parts.scheme else "no scheme"
        raise SettingsError(f"{key} is not a {'/'.join(schemes)} URL ({shown}"
                            f"{'' if parts.scheme == 'unix' or parts.hostname else ', no host'})")
    return value.rstrip("/")


def url_setting(
    env: Mapping[str, str], key: str, default: str, schemes: tuple[str, ...] = ("http", "https")
) -> str:
    return checked_url(key, env.get(key, default), schemes)


def url_list_setting(env: Mapping[str, str], key: str, default: str) -> str:
    """One or more http(s) URLs, comma-separated (e.g. every node of a Vault cluster); each is
    checked; returned joined by commas without trailing slashes."""
    items = [item.strip() for item in env.get(key, default).split(",")]
    return ",".join(checked_url(key, item) for item in items)


def redis_url_setting(env: Mapping[str, str], key: str, default: str) -> str:
    """A Redis URL valetkey can use (``contract/redis_url.py``: one server, Sentinel or Cluster)."""
    value = env.get(key, default)
    try:
        return redis_url.check(value).rstrip("/")
    except redis_url.RedisUrlError as exc:
        raise SettingsError(f"{key}: {exc}") from None


def directory(env: Mapping[str, str], key: str, default: Path) -> Path:
    path = Path(env.get(key, str(default)))
    if not path.is_dir():
        raise SettingsError(f"{key}={str(path)!r} is not a directory")
    return path


def int_setting(key: str, value: str, low: int, high: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise SettingsError(f"{key}: {value!r} is not a whole number") from None
    if not low <= number <= high:
        raise SettingsError(f"{key}: {number} is outside {low}..{high}")
    return number


def listen(key: str, value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) → (host, port); a bare host or port names the form."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise SettingsError(f"{key}={value!r} is not HOST:PORT (e.g. 127.0.0.1:8400 or 0.0.0.0:8080)")
    return host.strip("[]") or "127.0.0.1", int_setting(key, port, 0, 65535)


def duration(env: Mapping[str, str], key: str, default: str) -> int:
    try:
        return parse_duration(env.get(key, default))
    except ValueError as exc:
        raise SettingsError(f"{key}: {exc}") from None
