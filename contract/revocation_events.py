"""The one way a revocation or a lift is written and told: the record in Redis (``RevocationStore``)
and its line in the audit stream, with the same fields whoever wrote it.

The broker's routes and its end of a run, a gateway's ``/.valetkey/end-run``, an alert's
auto-revoke and the CLI's break-glass all call ``revoke_and_record`` (or ``record_event`` after a
lift), so the audit trail cannot miss a revocation nor spell one differently.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis.asyncio as aioredis

from contract import audit_stream
from contract.errors import Unavailable
from contract.revocations import Revocation, RevocationStore, Scope

log = logging.getLogger("valetkey.revocations")


def event_line(revocation: Revocation, action: str, **marks: Any) -> dict[str, Any]:
    """The audit line of a revocation or a lift (``marks``: e.g. ``runtime``, the break-glass
    fields)."""
    line: dict[str, Any] = {"event": action, "scope": revocation.scope.value, "name": revocation.name,
                            "who": revocation.lifted_by if action == "lift" else revocation.who,
                            "why": revocation.why, "time": revocation.lifted_at or revocation.when}
    if revocation.scope is Scope.RUN:
        line["run"] = revocation.name
    elif revocation.scope is Scope.RUNTIME:
        line["runtime"] = revocation.name
    return {**line, **marks}


async def record_event(client: aioredis.Redis, revocation: Revocation, action: str, maxlen: int,
                       **marks: Any) -> bool:
    """Log the event and append it to the audit stream. The revocation is already recorded when
    this runs: a stream that cannot be written is logged (``audit_stream_write_failed``) and
    reported as ``False``, never turned into a failed revocation."""
    line = event_line(revocation, action, **marks)
    log.info(json.dumps(line, sort_keys=True))
    try:
        await audit_stream.append(client, line, kind="revocation", maxlen=maxlen)
    except Unavailable as exc:
        log.warning(json.dumps({"event": "audit_stream_write_failed", "action": action,
                                "scope": revocation.scope.value, "name": revocation.name,
                                "reason": exc.code}))
        return False
    return True


async def revoke_and_record(client: aioredis.Redis, revocation: Revocation, maxlen: int,
                            **marks: Any) -> Revocation:
    """Record the revocation (hash + publish, one transaction), then its audit line. A failure to
    record raises (``Unavailable``: nothing is in force); a failure to audit does not."""
    recorded = await RevocationStore(client).revoke(revocation)
    await record_event(client, recorded, "revoke", maxlen, **marks)
    return recorded
