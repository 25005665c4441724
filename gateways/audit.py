"""One canonical audit line per request, with constant field names, to stdout and a Redis stream,
plus the Prometheus metrics labelled with the same reason codes.

The line never carries a header value, a body, a token or a secret: the path's query values are
masked, and only fields built here are written. Writing to Redis happens off the request path
through a bounded buffer that outlives a Redis outage (lines are written, in order, once Redis is
back); only lines that find the buffer full are dropped from the stream, and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote_plus

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from redis.exceptions import RedisError

from contract.errors import Decision, ValetkeyError
from contract.tasks import stop_task

log = logging.getLogger("valetkey.audit")
Observer = Callable[["AuditRecord", int], Awaitable[None]]
BUFFER_SIZE = 100_000  # lines held for the stream while Redis is unreachable (~40 MB at most)

# KEYS[1] the stream; ARGV[1] its approximate MAXLEN, then (line, run, runtime) per audit line:
# the same entries as ``XADD stream MAXLEN ~ N * line … run … runtime … kind request``
_APPEND = """
for i = 2, #ARGV, 3 do
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*',
             'line', ARGV[i], 'run', ARGV[i + 1], 'runtime', ARGV[i + 2], 'kind', 'request')
end
return (#ARGV - 1) / 3
"""


_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.\-\[\]]{1,64}")


def masked_path(path: str, query: bytes) -> str:
    """``/x?a=1&b=2`` → ``/x?a=***&b=***``: plain names stay, values never appear. An item
    without ``=`` is all value (``?hunter2``), and a name that is not a plain token may be one:
    both are written ``***``."""
    if not query:
        return path
    items = []
    for item in query.decode("latin-1").split("&"):
        name, sep, _ = item.partition("=")
        name = unquote_plus(name)
        items.append(f"{quote(name, safe='')}=***" if sep and _PLAIN_NAME.fullmatch(name) else "***")
    return f"{path}?{'&'.join(items)}"


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
    decision: Decision = Decision.DENY
    reason: str = ""
    status: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    duration_ms: float = 0.0
    upstream_addr: str = ""
    redactions: int = 0
    passthrough: str = ""  # where a real-looking credential was found (never the value)
    credential_kind: str = ""  # a run-scoped credential source's kind (gateways/sources), or ""
    credential_id: str = ""  # its non-secret identifier (token expiry, lease id), never the value
    approval: str = ""  # the pending approval this request waited on (gateways/approval_step.py)
    approved_by: str = ""  # who approved (or denied) it
    host: str = ""  # the egress proxy: a host no destination names, asked about (not a metric label)

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
        self.audit_pending = Gauge(
            "valetkey_gateway_audit_pending", "Audit lines held for the Redis stream, not yet written",
            registry=self.registry,
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
    """stdout line now; Redis stream (XADD MAXLEN ~) from a background task, in order.

    Lines wait in a bounded in-memory buffer until Redis has them. While Redis is unreachable
    they stay there, in order, and the writer retries with backoff (``RETRY_FIRST`` doubling to
    ``RETRY_MAX``); once Redis answers again the backlog is written oldest first, and the alert
    detectors (``observer``) see each line after it is in the stream. Only when the buffer is full
    are new lines dropped from the stream (they are still on stdout), counted in
    ``valetkey_gateway_audit_dropped_total`` and in one log line per outage.
    """

    RETRY_FIRST, RETRY_MAX = 0.1, 2.0
    BATCH = 256

    def __init__(self, redis: aioredis.Redis, stream: str, maxlen: int, metrics: Metrics,
                 buffer: int = BUFFER_SIZE) -> None:
        self._redis = redis
        self._stream = stream
        self._maxlen = maxlen
        self._metrics = metrics
        self._limit = buffer
        self._buffer: deque[tuple[AuditRecord, int, str]] = deque()  # not yet in the stream
        self._unobserved: deque[tuple[AuditRecord, int]] = deque()  # in the stream, not yet observed
        self._wake = asyncio.Event()  # set when a line arrives
        self._idle = asyncio.Event()  # set while everything written has reached the stream
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._append: Any = redis.register_script(_APPEND)
        self.observer: Observer | None = None  # the alert detectors, fed after each batch
        metrics.audit_pending.set_function(lambda: len(self._buffer))
        self.dropped = 0  # lines not written to the stream (buffer full)
        self.written = 0  # lines written to the stream

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def write(self, record: AuditRecord, run_expires: int = 0) -> None:
        line = record.to_json()
        if log.isEnabledFor(logging.INFO):
            log.info(line)
        self._metrics.observe(record)
        if len(self._buffer) >= self._limit:
            self.dropped += 1
            self._metrics.audit_dropped.labels(record.upstream).inc()
            return
        self._buffer.append((record, run_expires, line))  # serialised once, written twice
        self._idle.clear()
        self._wake.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._drain(), name="audit-drain")

    async def stop(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):  # let buffered lines reach Redis before exiting
                if self._task is not None and not self._task.done():
                    await self._idle.wait()
        await stop_task(self._task)
        self._task = None

    async def _drain(self) -> None:
        delay = self.RETRY_FIRST
        failing = False
        while True:
            if not self._buffer and not self._unobserved:
                self._wake.clear()
                self._idle.set()
                await self._wake.wait()
            try:
                await self._step()
            except (RedisError, OSError, ValetkeyError) as exc:
                if not failing:  # one line per outage, not one per retry
                    log.warning('{"event":"audit_stream_write_failed","pending":%d,"error":"%s"}',
                                len(self._buffer), type(exc).__name__)
                failing = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.RETRY_MAX)
                continue
            if failing:
                log.warning('{"event":"audit_stream_recovered","pending":%d,"dropped":%d}',
                            len(self._buffer), self.dropped)
            failing, delay = False, self.RETRY_FIRST

    async def _step(self) -> None:
        """Observe what is already in the stream, then write the next batch; raises on a Redis
        failure with nothing lost (what failed stays at the front of its queue)."""
        while self._unobserved:
            record, run_expires = self._unobserved[0]
            if self.observer is not None:
                await self.observer(record, run_expires)
            self._unobserved.popleft()
        batch = list(itertools.islice(self._buffer, self.BATCH))
        if not batch:
            return
        await self._write([(record, line) for record, _, line in batch])
        for _ in batch:
            self._buffer.popleft()
        self.written += len(batch)
        if self.observer is not None:
            self._unobserved.extend((record, run_expires) for record, run_expires, _ in batch)

    async def _write(self, batch: list[tuple[AuditRecord, str]]) -> None:
        """One script call appends the batch: a pipeline of XADDs cost a worker ~8 % of its CPU
        in redis-py's command packing alone (14 arguments per line; here 3)."""
        args: list[str | int] = [self._maxlen]
        for record, line in batch:
            args += (line, record.run, record.runtime)
        await self._append(keys=[self._stream], args=args)
