"""The audit stream in Redis: one bounded stream that gateways and the broker append to, and the
readers behind ``valetkey audit`` and ``GET /v1/runs/{id}/audit``.

Retention: ``XADD ... MAXLEN ~ N`` (default 100,000 entries, ``VALETKEY_AUDIT_MAXLEN``): Redis
trims whole macro-nodes, so the stream holds at least N and a little more. Each entry has the
fields ``line`` (the canonical JSON line), ``run``, ``runtime`` and ``kind``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from contract import keys
from contract.errors import Reason, Unavailable

STREAM = keys.AUDIT_STREAM
DEFAULT_MAXLEN = 100_000


async def append(client: aioredis.Redis, line: dict[str, Any], kind: str,
                 maxlen: int = DEFAULT_MAXLEN) -> None:
    """Append one event (revocations, alerts, run lifecycle) to the stream."""
    fields = {"line": json.dumps(line, sort_keys=True, separators=(",", ":")), "kind": kind,
              "run": str(line.get("run", "")), "runtime": str(line.get("runtime", ""))}
    try:
        await client.xadd(STREAM, fields, maxlen=maxlen, approximate=True)  # type: ignore[arg-type]
    except (RedisError, OSError) as exc:
        raise _unavailable(exc) from None


@dataclass(frozen=True)
class Filter:
    run: str = ""
    runtime: str = ""
    upstream: str = ""
    decision: str = ""
    reason: str = ""
    kind: str = ""

    def matches(self, entry: dict[str, Any]) -> bool:
        line = entry["line"]
        return all(
            not want or str(have) == want
            for want, have in ((self.run, line.get("run", "")), (self.runtime, line.get("runtime", "")),
                               (self.upstream, line.get("upstream", "")),
                               (self.decision, line.get("decision", "")),
                               (self.reason, line.get("reason", "")), (self.kind, entry["kind"]))
        )


def _entry(entry_id: Any, fields: Any) -> dict[str, Any]:
    raw = fields.get(b"line", b"{}")
    try:
        line = json.loads(raw)
    except ValueError:
        line = {"unreadable": True}
    return {"id": entry_id.decode() if isinstance(entry_id, bytes) else entry_id,
            "kind": fields.get(b"kind", b"request").decode(), "line": line}


def _unavailable(exc: Exception) -> Unavailable:
    return Unavailable(f"audit stream unavailable: {type(exc).__name__}", Reason.REDIS_UNAVAILABLE)


async def query(
    client: aioredis.Redis, flt: Filter, *, since: float | None = None, until: float | None = None,
    limit: int = 100, scan_max: int = 200_000,
) -> list[dict[str, Any]]:
    """Newest first; scans backwards in pages from ``until`` down to ``since``."""
    high = f"{int(until * 1000)}" if until else "+"
    low = f"{int(since * 1000)}" if since else "-"
    out: list[dict[str, Any]] = []
    scanned = 0
    try:
        while len(out) < limit and scanned < scan_max:
            page: Any = await client.xrevrange(STREAM, max=high, min=low, count=500)
            if not page:
                break
            scanned += len(page)
            for entry_id, fields in page:
                entry = _entry(entry_id, fields)
                if flt.matches(entry):
                    out.append(entry)
            last = page[-1][0].decode()
            ms, _, seq = last.partition("-")
            high = f"({last}" if seq else f"({ms}"
    except (RedisError, OSError) as exc:
        raise _unavailable(exc) from None
    return out[:limit]


async def follow(client: aioredis.Redis, flt: Filter, *, start: str = "$",
                 block_ms: int = 1000) -> AsyncIterator[dict[str, Any]]:
    """New entries as they arrive (XREAD BLOCK)."""
    last = start
    while True:
        try:
            answer: Any = await client.xread({STREAM: last}, block=block_ms, count=100)
        except (RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        for _stream, entries in answer or []:
            for entry_id, fields in entries:
                last = entry_id.decode()
                entry = _entry(entry_id, fields)
                if flt.matches(entry):
                    yield entry


def render(entry: dict[str, Any]) -> str:
    """One readable line: time, kind, who, what, decision."""
    line = entry["line"]
    moment = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(float(line.get("time", 0))))
    if entry["kind"] == "request":
        what = (f"{line.get('upstream', '')} {line.get('method', '')} {line.get('path', '')} "
                f"-> {line.get('status', '')} {line.get('decision', '')}/{line.get('reason', '')}")
        extra = f" redactions={line['redactions']}" if line.get("redactions") else ""
        return f"{moment} {line.get('run', '-') or '-'} {line.get('runtime', '-') or '-'} {what}{extra}"
    detail = " ".join(f"{k}={v}" for k, v in sorted(line.items()) if k not in ("time", "event"))
    return f"{moment} {entry['kind']}:{line.get('event', '')} {detail}"
