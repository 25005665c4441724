"""The CA file a run bundle carries when a proxy is configured, kept fresh in the background.

The file is the proxy CA's public certificates (``secret/valetkey/proxy/ca-public``: current,
then previous during a rotation) followed by the roots of ``VALETKEY_PROXY_TRUST_FILE``, so one
``SSL_CERT_FILE`` serves terminated destinations (signed by the proxy CA) and tunnelled ones
(their own certificates). Read at start and every ``ca_refresh`` seconds by a background task;
the mint path only reads the last good value and never waits on Vault.

Fail closed: until a first good read, minting with a proxy configured is refused with
``503 proxy_ca_unavailable`` (a bundle without the CA would send the sandbox to the proxy with
nothing to trust it by, or tempt it to switch verification off). After a good read a failed
refresh keeps the last good value: the certificates are public, a stale copy only lacks a CA
rotated in since, and a rotation keeps the previous certificate for exactly that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from broker.proxy_settings import ProxySettings
from contract.ca import CA_PUBLIC_PATH, CAError, public_certs
from contract.errors import Reason, Unavailable, ValetkeyError
from contract.vault import VaultClient
from policies.model import SecretRef

RETRY = 2.0  # seconds between reads while there is no good value yet
log = logging.getLogger("valetkey.broker")


class ProxyTrust:
    def __init__(self, vault: VaultClient, settings: ProxySettings) -> None:
        self._vault = vault
        self._settings = settings
        self._ref = SecretRef(settings.ca_mount, CA_PUBLIC_PATH, "certs")
        self._roots = _read_roots(settings.trust_file)
        self._pem: str | None = None
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> bool:
        """Read ``ca-public`` once; True when the bundle file is (still) current."""
        try:
            certs = public_certs({"certs": (await self._vault.kv_read(self._ref)).reveal()})
        except (ValetkeyError, CAError) as exc:
            log.warning('{"event":"proxy_ca_refresh_failed","reason":"%s"}',
                        getattr(exc, "code", "proxy_ca_invalid"))
            return False
        self._pem = certs + self._roots
        return True

    @property
    def ready(self) -> bool:
        """A good read happened: bundles can be minted (``/readyz`` check ``proxy_ca``)."""
        return self._pem is not None

    def bundle_pem(self) -> str:
        """The CA file for a bundle, from memory; 503 proxy_ca_unavailable before a good read."""
        if self._pem is None:
            raise Unavailable("the egress proxy's CA certificates could not be read from Vault yet "
                              f"({self._settings.ca_mount}/{CA_PUBLIC_PATH}; run `valetkey vault "
                              "bootstrap`)", Reason.PROXY_CA_UNAVAILABLE)
        return self._pem

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="proxy-ca-refresh")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            ok = await self.refresh()
            await asyncio.sleep(self._settings.ca_refresh if ok else RETRY)


def _read_roots(path: Path | None) -> str:
    if path is None:
        return ""
    text = path.read_text(encoding="utf-8", errors="replace")
    return text if text.endswith("\n") or not text else text + "\n"
