"""One canonical audit line per request, with constant field names, to stdout and a Redis stream,
plus the Prometheus metrics labelled with the same reason codes.

The line never carries a header value, a body, a token or a secret: the path's query values are
masked, and only fields built here are written. Writing to Redis happens off the request path
through a bounded queue; if Redis is slow the oldest pending lines are dropped and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter, Histogram
from redis.exceptions import RedisError

from broker.errors import ValetkeyError
from broker.tasks import stop_task

log = logging.getLogger("valetkey.audit")
Observer = Callable[["AuditRecord", int], Awaitable[None]]
QUEUE_SIZE = 10_000

# KEYS[1] the stream; ARGV[1] its approximate MAXLEN, then (line, run, runtime) per audit line:
# the same entries as ``XADD stream MAXLEN ~ N * line … run … runtime … kind request``
_APPEND = """
for i = 2, #ARGV, 3 do
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*',
             'line', ARGV[i], 'run', ARGV[i + 1], 'runtime', ARGV[i + 2], 'kind', 'request')
end
return (#ARGV - 1) / 3
"""


def masked_path(path: str, query: bytes) -> str:
    """``/x?a=1&b=2`` → ``/x?a=***&b=***``: names stay, values never appear."""
    if not query:
        return path
    names = [quote(k, safe="") for k, _ in parse_qsl(query.decode("latin-1"), keep_blank_values=True)]
    return f"{path}?{'&'.join(f'{n}=***' for n in names)}" if names else f"{path}?***"


@dataclass
class AuditRecord:
    request_id: str
    upstream: str
    method: str
    path: str
    time: float = field(default_factory=time.time)
    run: str = ""
    runtime: str = ""
    purpose: str = ""
    decision: str = "deny"
    reason: str = ""
    status: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    duration_ms: float = 0.0
    upstream_addr: str = ""
    redactions: int = 0
    passthrough: str = ""  # where a real-looking credential was found (never the value)

    def to_json(self) -> str:
        # every field is a str, int or float: a shallow dict is the whole record (asdict deep-copies)
        return json.dumps(vars(self), separators=(",", ":"), sort_keys=True)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "valetkey_gateway_requests", "Requests by decision and reason code",
            ["upstream", "decision", "reason"], registry=self.registry,
        )
        self.latency = Histogram(
            "valetkey_gateway_request_seconds", "Request duration through the gateway",
            ["upstream", "decision"], registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60),
        )
        self.bytes = Counter(
            "valetkey_gateway_bytes", "Body bytes", ["upstream", "direction"], registry=self.registry,
        )
        self.redactions = Counter(
            "valetkey_gateway_redactions", "Secret occurrences redacted from responses",
            ["upstream"], registry=self.registry,
        )
        self.audit_dropped = Counter(
            "valetkey_gateway_audit_dropped", "Audit lines not written to Redis",
            ["upstream"], registry=self.registry,
        )
        self._children: dict[tuple[str, str, str], tuple[Any, ...]] = {}

    def observe(self, record: AuditRecord) -> None:
        key = (record.upstream, record.decision, record.reason)
        children = self._children.get(key)
        if children is None:  # label lookups cost more than the updates: once per label set
            children = self._children[key] = (
                self.requests.labels(*key), self.latency.labels(record.upstream, record.decision),
                self.bytes.labels(record.upstream, "in"), self.bytes.labels(record.upstream, "out"),
                self.redactions.labels(record.upstream))
        requests, latency, bytes_in, bytes_out, redactions = children
        requests.inc()
        latency.observe(record.duration_ms / 1000)
        if record.bytes_in:
            bytes_in.inc(record.bytes_in)
        if record.bytes_out:
            bytes_out.inc(record.bytes_out)
        if record.redactions:
            redactions.inc(record.redactions)


class AuditSink:
    """stdout line now; Redis stream (XADD MAXLEN ~) from a background task."""

    def __init__(self, redis: aioredis.Redis, stream: str, maxlen: int, metrics: Metrics) -> None:
        self._redis = redis
        self._stream = stream
        self._maxlen = maxlen
        self._metrics = metrics
        self._queue: asyncio.Queue[tuple[AuditRecord, int, str]] = asyncio.Queue(QUEUE_SIZE)
        self._task: asyncio.Task[None] | None = None
        self._append: Any = redis.register_script(_APPEND)
        self.observer: Observer | None = None  # the alert detectors, fed after each batch

    def write(self, record: AuditRecord, run_expires: int = 0) -> None:
        line = record.to_json()
        if log.isEnabledFor(logging.INFO):
            log.info(line)
        self._metrics.observe(record)
        try:
            self._queue.put_nowait((record, run_expires, line))  # serialised once, written twice
        except asyncio.QueueFull:
            self._metrics.audit_dropped.labels(record.upstream).inc()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._drain(), name="audit-drain")

    async def stop(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):  # let queued lines reach Redis before exiting
                await self._queue.join()
        await stop_task(self._task)
        self._task = None

    async def _drain(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while not self._queue.empty() and len(batch) < 256:
                batch.append(self._queue.get_nowait())
            try:
                await self._write([(record, line) for record, _, line in batch])
                if self.observer is not None:
                    for record, run_expires, _ in batch:
                        await self.observer(record, run_expires)
            except (RedisError, OSError, ValetkeyError):
                for record, _, _ in batch:
                    self._metrics.audit_dropped.labels(record.upstream).inc()
                log.warning('{"event":"audit_stream_write_failed","lines":%d}', len(batch))
                await asyncio.sleep(0.5)
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def _write(self, batch: list[tuple[AuditRecord, str]]) -> None:
        """One script call appends the batch: a pipeline of XADDs cost a worker ~8 % of its CPU
        in redis-py's command packing alone (14 arguments per line; here 3)."""
        args: list[str | int] = [self._maxlen]
        for record, line in batch:
            args += (line, record.run, record.runtime)
        await self._append(keys=[self._stream], args=args)
