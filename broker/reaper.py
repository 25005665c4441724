"""The broker's background work on revocations.

* A run can be revoked by an admin, by its runtime ending it, by an alert (auto-revoke, written by
  a gateway) or by itself (``/.valetkey/end-run``). Whatever wrote it, the broker sees it on the
  revocation channel and finishes the job only it can do: mark the run ended in the registry and
  revoke every Vault token attached to the run (gateways have no Vault rights for that).
* The revocation hash is purged at start and every ``PURGE_EVERY`` seconds: expired records, and
  junk (fields that name no scope; runtimes and upstreams not in policy, after a grace); an
  unreadable record of a real scope is rewritten as a proper block an admin can see and lift
  (``contract/revocations.py``).

Idempotent: several broker replicas may all do it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from redis.exceptions import RedisError

from broker.services import Services
from contract.errors import ValetkeyError
from contract.revocations import CHANNEL, Revocation, Scope, in_policy
from contract.tasks import stop_task

log = logging.getLogger("valetkey.broker")
PURGE_EVERY = 300.0


async def finish_run(svc: Services, revocation: Revocation) -> None:
    record = await svc.runs.get(revocation.name)
    if record is None:
        return
    if record.state != "ended":
        await svc.runs.end(record.run_id, revocation.who)
    for accessor in record.vault_accessors:
        try:
            await svc.vault.revoke_accessor(accessor)
        except ValetkeyError as exc:
            log.warning('{"event":"vault_revoke_failed","run":"%s","reason":"%s"}', record.run_id, exc.code)


class Reaper:
    def __init__(self, svc: Services) -> None:
        self._svc = svc
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._watch(), name="broker-reaper"),
                       asyncio.create_task(self._purge(), name="broker-purge")]

    async def stop(self) -> None:
        # stop_task, not cancel + await: redis-py's wait_for can swallow a cancellation (3.11)
        for task in self._tasks:
            await stop_task(task)

    async def _watch(self) -> None:
        while True:
            pubsub = self._svc.redis.pubsub()
            try:
                await pubsub.subscribe(CHANNEL)
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    try:
                        revocation = Revocation.from_json(message["data"])
                    except (ValueError, TypeError, KeyError):
                        continue
                    if revocation.scope is Scope.RUN:
                        await finish_run(self._svc, revocation)
            except (RedisError, OSError, ValetkeyError) as exc:
                log.warning('{"event":"reaper_watch_lost","error":"%s"}', type(exc).__name__)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            await asyncio.sleep(1.0)

    async def _purge(self) -> None:
        while True:
            try:
                counts = await self._svc.revocations.purge(in_policy(self._svc.policies))
            except ValetkeyError as exc:
                log.warning('{"event":"revocation_purge_failed","reason":"%s"}', exc.code)
            else:
                if any(counts.values()):
                    log.info(json.dumps({"event": "revocations_purged", **counts}, sort_keys=True))
            await asyncio.sleep(PURGE_EVERY)

