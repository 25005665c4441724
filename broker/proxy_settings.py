"""The broker's egress-proxy settings, read once with the rest of ``BrokerSettings``.

==============================  =========================  =====================================
variable                        default                    meaning
==============================  =========================  =====================================
VALETKEY_PROXY_URL              "" (no proxy)              the proxy sandboxes use, no userinfo
VALETKEY_PROXY_AUDIENCE         egress                     audience of the per-run proxy token
VALETKEY_EGRESS                 gateway                    gateway | proxy | both (base URLs)
VALETKEY_SANDBOX_CA_PATH        /etc/valetkey/ca.pem       where the sandbox finds the CA file
VALETKEY_PROXY_TRUST_FILE       system bundle / certifi    roots appended after the proxy CA
VALETKEY_PROXY_CA_MOUNT         secret                     KV v2 mount of valetkey/proxy/ca-public
VALETKEY_PROXY_CA_REFRESH       60s                        how often ca-public is read again
==============================  =========================  =====================================
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from contract.env import SettingsError, checked_url, duration

AUDIENCE = re.compile(r"^[a-z][a-z0-9-]{0,62}$")  # as policy names: one namespace of audiences


class Egress(StrEnum):
    GATEWAY = "gateway"  # base-URL variables point at gateways (today's bundle)
    PROXY = "proxy"  # no base-URL variables: clients use their default hosts through the proxy
    BOTH = "both"


@dataclass(frozen=True)
class ProxySettings:
    url: str = ""
    audience: str = "egress"
    egress: Egress = Egress.GATEWAY
    sandbox_ca_path: str = "/etc/valetkey/ca.pem"
    trust_file: Path | None = None
    ca_mount: str = "secret"
    ca_refresh: int = 60

    @property
    def enabled(self) -> bool:
        return bool(self.url)

    def url_with(self, token: str) -> str:
        """``http://run:<token>@host:port``: curl, git, pip, npm, requests and httpx all send
        it as ``Proxy-Authorization: Basic``. A token is base64url and dots: nothing to escape."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://run:{token}@{parts.netloc}"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ProxySettings:
        url = _proxy_url(env.get("VALETKEY_PROXY_URL", ""))
        audience = env.get("VALETKEY_PROXY_AUDIENCE", "egress")
        if not AUDIENCE.fullmatch(audience):
            raise SettingsError(f"VALETKEY_PROXY_AUDIENCE: {audience!r} does not match {AUDIENCE.pattern}")
        egress = next((e for e in Egress if e.value == env.get("VALETKEY_EGRESS", "gateway")), None)
        if egress is None:
            raise SettingsError("VALETKEY_EGRESS must be gateway, proxy or both")
        if egress is not Egress.GATEWAY and not url:
            raise SettingsError(f"VALETKEY_EGRESS={egress} needs VALETKEY_PROXY_URL")
        ca_path = env.get("VALETKEY_SANDBOX_CA_PATH", "/etc/valetkey/ca.pem")
        pure = PurePosixPath(ca_path)
        if not pure.is_absolute() or ".." in pure.parts or pure.name in ("", "."):
            raise SettingsError(f"VALETKEY_SANDBOX_CA_PATH: {ca_path!r} is not an absolute file path")
        return cls(url=url, audience=audience, egress=egress, sandbox_ca_path=ca_path,
                   trust_file=_trust_file(env.get("VALETKEY_PROXY_TRUST_FILE", "")) if url else None,
                   ca_mount=env.get("VALETKEY_PROXY_CA_MOUNT", "secret"),
                   ca_refresh=duration(env, "VALETKEY_PROXY_CA_REFRESH", "60s"))


def _proxy_url(raw: str) -> str:
    if not raw:
        return ""
    url = checked_url("VALETKEY_PROXY_URL", raw)
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None or parts.path not in ("", "/") \
            or parts.query or parts.fragment:
        raise SettingsError("VALETKEY_PROXY_URL must be scheme://host:port only (the broker adds "
                            "each run's credentials)")
    return url


def _trust_file(raw: str) -> Path:
    """The roots sandboxes need besides the proxy CA (tunnelled destinations present their own
    certificates): the named file, else the system bundle, else certifi's."""
    if raw:
        path = Path(raw)
        if not path.is_file():
            raise SettingsError(f"VALETKEY_PROXY_TRUST_FILE={raw!r} is not a file")
        return path
    system = ssl.get_default_verify_paths().cafile
    if system and Path(system).is_file():
        return Path(system)
    import certifi

    return Path(certifi.where())
