"""The gateway's copy of its one upstream secret: read from Vault with the gateway's own identity,
cached in memory, refreshed in the background. The request path only calls ``current()``.

Identity: AppRole (role id + secret id) in production, re-logging in before the token's lease
ends; a plain token in development. The store keeps the previous value after a rotation so
redaction can still catch echoes of it. If Vault stays unreachable for longer than ``max_stale``
the store fails closed (``secret_unavailable``).

A failed refresh is retried in the background with backoff (``RETRY_FIRST`` doubling up to the
refresh interval), logging in to AppRole again before each retry: a Vault that restarted and
lost its tokens (dev mode, a restore) is served again as soon as the gateway's credentials are
valid there again — the same role id and secret id restored, or a new secret id written to
``VALETKEY_VAULT_SECRET_ID_FILE``, which is read again at every login. Never on the request path.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from contract.errors import Reason, Unavailable, ValetkeyError
from contract.secret import Secret
from contract.tasks import stop_task
from contract.vault import VaultClient
from policies.model import SecretRef

log = logging.getLogger("valetkey.gateway")
RETRY_FIRST = 1.0  # seconds before the first retry of a failed refresh


class SecretStore:
    def __init__(
        self,
        vault: VaultClient,
        ref: SecretRef | None,
        *,
        role_id: str = "",
        secret_id: Secret | None = None,
        secret_id_file: str = "",
        refresh: float = 60.0,
        max_stale: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._vault = vault
        self._ref = ref
        self._role_id = role_id
        self._secret_id = secret_id
        self._secret_id_file = secret_id_file
        self._refresh = refresh
        self._max_stale = max_stale
        self._clock = clock
        self._current: Secret | None = None
        self._previous: tuple[Secret, ...] = ()
        self._loaded_at = 0.0
        self._login_expires = 0.0  # AppRole: log in before the first read
        self._task: asyncio.Task[None] | None = None
        self.version = 0  # bumps on every change; redaction rebuilds its forms on a new version

    def __repr__(self) -> str:
        path = self._ref.api_path if self._ref else None
        return f"SecretStore(ref={path!r}, version={self.version})"

    async def _login(self) -> None:
        if not self._role_id or self._secret_id is None:
            return
        if self._clock() < self._login_expires:
            return
        if self._secret_id_file:  # the operator may have written a new one (after a Vault restore)
            try:
                text = await asyncio.to_thread(Path(self._secret_id_file).read_text, encoding="utf-8")
                value = text.strip()
            except OSError:
                value = ""  # unreadable now: keep the one we have
            if value:
                self._secret_id = Secret(value)
        token, lease = await self._vault.approle_login(self._role_id, self._secret_id)
        self._vault.set_token(token)
        # log in again at two thirds of the lease, so the token never expires in use
        self._login_expires = self._clock() + (lease * 2 / 3 if lease else float("inf"))

    async def load(self) -> None:
        """Read the secret now (start-up and each refresh); raises on failure."""
        await self._login()
        if self._ref is None:  # a credential source issues the credential: keep the login fresh
            self._loaded_at = self._clock()
            return
        value = await self._vault.kv_read(self._ref)
        if value != self._current:
            if self._current is not None:
                self._previous = (self._current, *self._previous)[:2]
            self._current = value
            self.version += 1
        self._loaded_at = self._clock()

    def current(self) -> Secret:
        if self._current is None or self._clock() - self._loaded_at > self._max_stale:
            raise Unavailable("the upstream secret could not be refreshed from Vault",
                              Reason.SECRET_UNAVAILABLE)
        return self._current

    def all_values(self) -> tuple[Secret, ...]:
        """Current and recently rotated-out values: everything redaction must catch."""
        return tuple(s for s in (self._current, *self._previous) if s is not None)

    async def start(self) -> None:
        await self.load()
        name = self._ref.path if self._ref else "login"
        self._task = asyncio.create_task(self._run(), name=f"secret-refresh:{name}")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None

    async def _run(self) -> None:
        pause, failures = self._refresh, 0
        while True:
            await asyncio.sleep(pause)
            try:
                await self.load()
            except Exception as exc:  # any failure: retry, never let the refresher die silently
                self._login_expires = 0.0  # the token may be gone: log in again next time
                pause = min(self._refresh, RETRY_FIRST * 2**failures)
                failures += 1
                code = exc.code if isinstance(exc, ValetkeyError) else type(exc).__name__
                log.warning('{"event": "secret_refresh_failed", "reason": "%s", "retry_in": %g}',
                            code, pause)
                continue
            if failures:
                log.warning('{"event": "secret_refresh_recovered", "failures": %d}', failures)
            pause, failures = self._refresh, 0
