"""The generation marker: how every replica learns that Redis lost its data.

One key, ``{vk:rev}:generation`` (in the revocation hash's slot: ``contract/keys.py``), holds
``{"id": …, "since": …}``. A broker writes it (``SET NX``)
only after it has put the durable copy of the standing revocations back into the hash
(``broker/revocation_keeper.py``). So:

* no marker: Redis lost its data (a flush, a restart without persistence, a failover to an empty
  replica) and no broker has restored the revocations yet. Nothing may be decided on Redis's
  revocation state: gateways refuse (``revocation_state_stale``), the broker mints nothing.
* a marker whose ``id`` differs from the one a process saw before: the data was lost and restored
  meanwhile. The process writes back the revocations it holds in memory (``HSETNX``: never over a
  newer record), then trusts Redis again.
* ``since``: when this generation began. Budget counts of a run minted before it were lost with
  the data, so such a run's budgeted requests are refused (``budget_state_lost``): budgets fail
  closed for the runs that lived through the loss, and start from zero for runs minted after.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from contract import keys

KEY = keys.GENERATION


@dataclass(frozen=True)
class Generation:
    id: str
    since: float


def parse(raw: bytes | str | None) -> Generation | None:
    """The marker, or None when it is missing or unreadable (both: not trusted)."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        return Generation(id=str(data["id"]), since=float(data["since"]))
    except (ValueError, TypeError, KeyError):
        return None


async def read(client: aioredis.Redis) -> Generation | None:
    return parse(await client.get(KEY))


async def establish(client: aioredis.Redis, now: float | None = None) -> Generation:
    """Start a generation unless one exists (another broker may have won); returns the current."""
    fresh = json.dumps({"id": secrets.token_hex(8), "since": time.time() if now is None else now})
    await client.set(KEY, fresh, nx=True)
    current = await read(client)
    if current is None:  # deleted again between the two calls: the next pass starts another
        raise ConnectionError("generation marker vanished while being written")
    return current
