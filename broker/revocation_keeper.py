"""The durable copy of the revocations in Vault KV, and their return to Redis after a data loss.

Redis is the truth for revocations while it has its data; this keeps a copy where a flush, a
restart without persistence or a failover to an empty replica cannot reach it: one KV v2 entry per
record, ``secret/valetkey/revocations/<entry>`` (``{"record": <the JSON record>}``). The entry is
the record's field (``run:<id>``…) when it is a plain path segment, else ``~`` and the field in
base64url: a revoked name is whatever an admin typed (``/``, ``..``, control characters), and it
must neither reach another KV path nor fail the request (``entry``/``field_of``).

* Every revocation and lift the broker makes is saved at once (``save``; best effort: if Vault is
  down the next sync saves it).
* Every ``SYNC_EVERY`` seconds each record in the Redis hash that differs from what this broker
  last saved is saved: those written by gateways (an alert's auto-revoke, a run ending itself) and
  by the CLI's break-glass. A saved record Redis no longer has is written back (``HSETNX``): a
  failover to a replica that missed the last writes loses no revocation the broker made, even for
  replicas started after it. A record is deleted from Vault once it has expired, or once its
  runtime or upstream has been out of policy for ``UNKNOWN_GRACE`` (as the reaper does in Redis);
  never because Redis no longer has it (that is the loss this copy is for).
* Every ``CHECK_EVERY`` seconds the generation marker (``contract/generation.py``) is read. When it
  is missing, every unexpired record in Vault is written back into the hash where the field is
  empty (``HSETNX``: never over a newer record) and announced, and only then a new generation is
  started. Until then gateways refuse and the broker mints nothing.

Idempotent and safe with several broker replicas: they all save the same records, and the first
to start the new generation wins (``SET NX``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from contract import generation, keys
from contract.errors import ValetkeyError
from contract.revocations import (
    HASH,
    UNKNOWN_GRACE,
    Revocation,
    RevocationStore,
    Scope,
    expired,
    scope_of,
)
from contract.tasks import stop_task
from contract.vault import VaultClient

log = logging.getLogger("valetkey.broker")
MOUNT = "secret"
PREFIX = "valetkey/revocations"
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}")  # one path segment, never . or ..
ENCODED = "~"  # not a scope's first letter: an encoded entry never looks like a plain field


def entry(field: str) -> str:
    """The KV entry name of a record's field: the field itself, or ``~`` + base64url of it."""
    if _PLAIN.fullmatch(field):
        return field
    return ENCODED + base64.urlsafe_b64encode(field.encode("utf-8", "surrogatepass")).decode().rstrip("=")


def field_of(name: str) -> str | None:
    """The field an entry name stands for (None: not one this keeper wrote)."""
    if not name.startswith(ENCODED):
        return name
    text = name[len(ENCODED):]
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("utf-8", "surrogatepass")
    except (binascii.Error, ValueError):
        return None
CHECK_EVERY = 0.5
SYNC_EVERY = 5.0
START_TIMEOUT = 10.0


class RevocationKeeper:
    def __init__(self, client: aioredis.Redis, vault: VaultClient, *, check_every: float = CHECK_EVERY,
                 sync_every: float = SYNC_EVERY, known: Callable[[Scope, str], bool] | None = None) -> None:
        self._redis = client
        self._vault = vault
        self._known = known  # is a runtime or upstream in policy (None: keep every record)
        self._check_every = check_every
        self._sync_every = sync_every
        self._saved: dict[str, str] = {}  # field → the record JSON this broker knows Vault holds
        self._task: asyncio.Task[None] | None = None
        self.restored = 0  # records written back by the last restore (tests, the log)

    async def start(self) -> None:
        """One pass now (bounded: a broker starts even if Vault or Redis does not answer; it then
        mints nothing until the marker exists), then the loop."""
        try:
            async with asyncio.timeout(START_TIMEOUT):
                await self._load_saved()
                await self.check()
                await self.sync()
        except (TimeoutError, RedisError, OSError, ValetkeyError) as exc:
            log.warning('{"event":"revocation_keeper_start_failed","error":"%s"}', type(exc).__name__)
        self._task = asyncio.create_task(self._loop(), name="revocation-keeper")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None

    async def save(self, record: Revocation) -> None:
        """Save one record now; a failure is logged, and the next sync retries."""
        try:
            await self._put(record.key, record.to_json())
        except ValetkeyError as exc:
            log.warning('{"event":"revocation_copy_failed","field":"%s","reason":"%s"}', record.key, exc.code)

    async def check(self) -> generation.Generation:
        """Restore the durable copy if the marker is missing; returns the current generation."""
        current = await generation.read(self._redis)
        if current is not None:
            return current
        store = RevocationStore(self._redis)
        restored = await store.restore(await self._load_saved())
        # an upgrade from before the {vk:rev} slot: the old hash may hold records no copy has yet
        # (a gateway's auto-revoke in the last seconds); never over what is restored
        legacy = await self._redis.hgetall(keys.LEGACY_REVOCATIONS)
        restored += await store.restore({_text(k): _text(v) for k, v in legacy.items() if scope_of(_text(k))})
        current = await generation.establish(self._redis)
        self.restored = restored
        log.warning(json.dumps({"event": "revocations_restored", "records": restored,
                                "generation": current.id}))
        return current

    async def sync(self) -> int:
        """Save what Redis holds and Vault does not; delete expired copies. Returns saves made."""
        raw = await self._redis.hgetall(HASH)
        saves = 0
        for key, value in raw.items():
            field, text = _text(key), _text(value)
            if scope_of(field) is None or self._saved.get(field) == text:
                continue
            await self._put(field, text)
            saves += 1
        now = time.time()
        present = {_text(key) for key in raw}
        missing: dict[str, str] = {}
        for field, text in list(self._saved.items()):
            record = _record(field, text)
            if record is None:
                continue
            if expired(record, now) or self._out_of_policy(record, now):
                await self._vault.kv_delete(MOUNT, f"{PREFIX}/{entry(field)}")
                self._saved.pop(field, None)
            elif field not in present:
                missing[field] = text
        if missing:
            written = await RevocationStore(self._redis).restore(missing)
            if written:
                log.warning(json.dumps({"event": "revocations_rewritten", "records": written}))
        return saves

    def _out_of_policy(self, record: Revocation, now: float) -> bool:
        return (self._known is not None and record.scope in (Scope.RUNTIME, Scope.UPSTREAM)
                and not self._known(record.scope, record.name)
                and max(record.when, record.lifted_at) + UNKNOWN_GRACE < now)

    async def _put(self, field: str, text: str) -> None:
        await self._vault.kv_put(MOUNT, f"{PREFIX}/{entry(field)}", {"record": text})
        self._saved[field] = text

    async def _load_saved(self) -> dict[str, str]:
        """Every unexpired record in Vault (field → JSON); also what this broker knows is saved."""
        now = time.time()
        out: dict[str, str] = {}
        for name in await self._vault.kv_list(MOUNT, PREFIX):
            field = field_of(name)
            if field is None:
                continue
            data = await self._vault.kv_get(MOUNT, f"{PREFIX}/{name}")
            text = data.get("record") if data else None
            record = _record(field, text) if isinstance(text, str) else None
            if record is None or not isinstance(text, str):
                continue
            self._saved[field] = text
            if not expired(record, now):
                out[field] = text
        return out

    async def _loop(self) -> None:
        last_sync = time.monotonic()
        while True:
            await asyncio.sleep(self._check_every)
            try:
                await self.check()
                if time.monotonic() - last_sync >= self._sync_every:
                    last_sync = time.monotonic()
                    await self.sync()
            except (RedisError, OSError, ValetkeyError) as exc:
                log.warning('{"event":"revocation_keeper_failed","error":"%s"}', type(exc).__name__)


def _record(field: str, text: str) -> Revocation | None:
    try:
        record = Revocation.from_json(text)
    except (ValueError, TypeError, KeyError):
        return None
    return record if record.key == field else None


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
