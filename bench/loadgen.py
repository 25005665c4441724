"""The harness's own HTTP/1.1 load generator, run as a separate process (asyncio, raw sockets).

    echo '{"mode": "open", ...}' | python -m bench.loadgen      # prints one JSON result

Modes:

* ``open`` — open loop at a fixed rate: request *i* is due at ``start + i / rate`` whatever happened
  to the ones before it; it goes out on an idle keep-alive connection (a new one is opened while
  fewer than ``connections`` exist, else it waits for one). Latency runs from the *intended* send
  time to the last byte of the response, so a stalled server is charged for the requests it held
  up (no coordinated omission). The generator's own lateness (actual minus intended send time) is
  reported beside it. The event loop uses ``select()`` (microsecond timeouts; epoll rounds up to
  whole milliseconds, which would make every request up to 1 ms late).
* ``closed`` — ``connections`` connections each send back to back for ``duration`` seconds
  (throughput at fixed concurrency; the fallback when wrk is not installed). With ``prewarm``
  (either loop), all ``connections`` are made and used once before the clock starts, so a
  CONNECT and TLS handshake is never inside a figure (keep-alive).
* ``sse`` — ``streams`` concurrent GETs of the upstream's ``/v1/sse?n=N``; each event carries the
  time the upstream emitted it (``t``), and its latency is the receive time minus ``t``.

Any mode may speak TLS and go through a forward proxy (table 7, the egress proxy): ``tls``
(``{"ca": PEM file, "sni": name}``) wraps each connection in TLS, verified for ``sni`` against
``ca``; ``proxy_auth`` (a ``Proxy-Authorization`` value) first sends ``CONNECT authority`` to
``host:port`` (then the proxy), and a refused CONNECT counts in ``connect_refused`` by status.
``authority`` is the ``Host`` (and CONNECT target); default ``host:port``.

Every response must be ``200`` (the upstream answers 401 unless the injected secret arrived) and
must not contain ``secret`` anywhere in its head or body: both are counted and reported, and the
harness fails the run on either.
"""

from __future__ import annotations

import asyncio
import json
import re
import selectors
import ssl
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:[ \t]*chunked", re.IGNORECASE)
_CLOSE = re.compile(rb"\r\nconnection:[ \t]*close", re.IGNORECASE)
MAX_WAIT = 30.0  # seconds any one run may overrun its duration before it is abandoned


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def summary_ms(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {"p50": round(percentile(ms, 50), 3), "p90": round(percentile(ms, 90), 3),
            "p99": round(percentile(ms, 99), 3), "max": round(max(ms, default=0.0), 3),
            "mean": round(sum(ms) / len(ms), 3) if ms else 0.0}


PROSE = (b"The agent opened an issue about the widget request: the client library retries on a "
         b"timeout, but the second attempt sends the old body and the server answers with a conflict. "
         b"Steps to reproduce, the build log and an example value are below; the reviewer asked for "
         b"more detail on retry and timeout handling before the fix is merged. ")


def json_body(size: int) -> bytes:
    """A JSON document of exactly ``size`` bytes that reads like an API payload (an issue with a
    title, labels and prose): deterministic, so every target and every run sends the same bytes.
    Not a run of one letter: the credential scanner's cost depends on which bytes it sees."""
    head = b'{"title":"Widget request fails on retry","labels":["bug","client"],"body":"'
    room = max(0, size - len(head) - 2)
    return head + (PROSE * (room // len(PROSE) + 1))[:room] + b'"}'


def authority(spec: dict[str, Any]) -> str:
    return str(spec.get("authority") or f"{spec['host']}:{spec['port']}")


def build_request(spec: dict[str, Any]) -> bytes:
    body = json_body(int(spec["body_size"])) if spec.get("body_size") else b""
    lines = [f"{spec.get('method', 'GET')} {spec['path']} HTTP/1.1", f"Host: {authority(spec)}"]
    lines += [f"{k}: {v}" for k, v in spec.get("headers", [])]
    if body:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bytes]:
    """(status, head, body) of one HTTP/1.1 response with Content-Length or chunked framing."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    if _CHUNKED.search(head):
        parts: list[bytes] = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers
                break
            parts.append((await reader.readexactly(size + 2))[:-2])
        return status, head, b"".join(parts)
    length = _LENGTH.search(head)
    return status, head, await reader.readexactly(int(length.group(1))) if length else b""


@dataclass
class Tally:
    secret: bytes
    completed: int = 0
    errors: int = 0
    leaks: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    lateness: list[float] = field(default_factory=list)
    refused: dict[str, int] = field(default_factory=dict)

    def count(self, status: int, head: bytes, body: bytes) -> None:
        self.completed += 1
        self.statuses[str(status)] = self.statuses.get(str(status), 0) + 1
        if self.secret and (self.secret in head or self.secret in body):
            self.leaks += 1

    def result(self, elapsed: float) -> dict[str, Any]:
        return {"completed": self.completed, "errors": self.errors, "leaks": self.leaks,
                "statuses": self.statuses, "connect_refused": self.refused,
                "non200": self.completed - self.statuses.get("200", 0),
                "elapsed_s": round(elapsed, 3), "rps": round(self.completed / elapsed, 1) if elapsed else 0.0,
                "latency_ms": summary_ms(self.latencies), "lateness_ms": summary_ms(self.lateness)}


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class ConnectRefused(OSError):
    """The forward proxy answered the CONNECT with something other than 200."""

    def __init__(self, status: int) -> None:
        super().__init__(f"CONNECT answered {status}")
        self.status = status


class Dialer:
    """Opens one connection as the spec says: TCP, then CONNECT through a proxy, then TLS."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.host, self.port = spec["host"], int(spec["port"])
        self.authority = authority(spec)
        self.proxy_auth = spec.get("proxy_auth")
        tls = spec.get("tls")
        self.context: ssl.SSLContext | None = None
        self.sni = ""
        if tls:
            self.context = ssl.create_default_context(cafile=tls["ca"])
            self.context.set_alpn_protocols(["http/1.1"])
            self.sni = tls["sni"]
        self.refused: dict[str, int] = {}

    async def __call__(self) -> Conn:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            if self.proxy_auth:
                writer.write(f"CONNECT {self.authority} HTTP/1.1\r\nHost: {self.authority}\r\n"
                             f"Proxy-Authorization: {self.proxy_auth}\r\n\r\n".encode("latin-1"))
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head[9:12])
                if status != 200:
                    self.refused[str(status)] = self.refused.get(str(status), 0) + 1
                    raise ConnectRefused(status)
            if self.context is not None:
                await writer.start_tls(self.context, server_hostname=self.sni)
        except BaseException:
            writer.close()
            raise
        return reader, writer


class Pool:
    """Keep-alive connections, at most ``size`` of them; a request waits when all are busy."""

    def __init__(self, spec: dict[str, Any], size: int) -> None:
        self.dial, self.size = Dialer(spec), size
        self.idle: deque[Conn] = deque()
        self.opened = 0
        self.waiters: deque[asyncio.Future[Conn | None]] = deque()

    async def acquire(self) -> Conn:
        while True:
            if self.idle:
                return self.idle.popleft()
            if self.opened < self.size:
                self.opened += 1
                try:
                    return await self.dial()
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
                    self.opened -= 1
                    raise
            waiter: asyncio.Future[Conn | None] = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            conn = await waiter
            if conn is not None:
                return conn

    def release(self, conn: Conn | None) -> None:
        """Give back a healthy connection, or ``None`` for one that was closed."""
        if conn is None:
            self.opened -= 1
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if conn is not None:
            self.idle.append(conn)

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()


async def exchange(pool: Pool, request: bytes, tally: Tally) -> bool:
    try:
        conn = await pool.acquire()
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
        tally.errors += 1
        return False
    reader, writer = conn
    try:
        writer.write(request)
        status, head, body = await read_response(reader)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
        writer.close()
        pool.release(None)
        tally.errors += 1
        return False
    tally.count(status, head, body)
    if _CLOSE.search(head):
        writer.close()
        pool.release(None)
    else:
        pool.release(conn)
    return True


async def open_loop(spec: dict[str, Any], tally: Tally) -> float:
    loop = asyncio.get_running_loop()
    pool = Pool(spec, int(spec.get("connections", 64)))
    tally.refused = pool.dial.refused
    request = build_request(spec)
    rate, duration = float(spec["rate"]), float(spec["duration"])
    for _ in range(int(spec.get("warmup", 20))):  # opens a few connections, not counted
        await exchange(pool, request, Tally(b""))
    if spec.get("prewarm"):  # every connection made before the schedule: latency on keep-alive only
        await asyncio.gather(*(exchange(pool, request, Tally(b"")) for _ in range(pool.size)))

    async def one(intended: float) -> None:
        tally.lateness.append(max(0.0, loop.time() - intended))
        if await exchange(pool, request, tally):
            tally.latencies.append(loop.time() - intended)

    tasks: list[asyncio.Task[None]] = []
    start = loop.time() + 0.01
    for i in range(int(rate * duration)):
        intended = start + i / rate
        delay = intended - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(intended)))
    await asyncio.wait(tasks, timeout=MAX_WAIT)
    elapsed = loop.time() - start
    tally.errors += sum(1 for t in tasks if not t.done())
    for task in tasks:
        task.cancel()
    pool.close()
    return elapsed


async def closed_loop(spec: dict[str, Any], tally: Tally) -> float:
    loop = asyncio.get_running_loop()
    request = build_request(spec)
    connections, duration = int(spec.get("connections", 32)), float(spec["duration"])
    pool = Pool(spec, connections)
    tally.refused = pool.dial.refused
    if spec.get("prewarm"):  # every connection made (CONNECT, TLS) and used once before the clock starts
        await asyncio.gather(*(exchange(pool, request, Tally(b"")) for _ in range(connections)))
    deadline = loop.time() + duration

    async def worker() -> None:
        while loop.time() < deadline:
            sent = loop.time()
            if await exchange(pool, request, tally):
                tally.latencies.append(loop.time() - sent)

    start = loop.time()
    await asyncio.wait([asyncio.create_task(worker()) for _ in range(connections)],
                       timeout=duration + MAX_WAIT)
    pool.close()
    return loop.time() - start


class Dechunker:
    """Incremental decoder of a chunked body (the SSE stream as it arrives)."""

    def __init__(self) -> None:
        self.buffer = b""
        self.remaining = 0

    def feed(self, data: bytes) -> bytes:
        self.buffer += data
        out = b""
        while self.buffer:
            if self.remaining:
                take = self.buffer[:self.remaining]
                out += take
                self.buffer = self.buffer[len(take):]
                self.remaining -= len(take)
                continue
            if self.buffer.startswith(b"\r\n"):
                self.buffer = self.buffer[2:]
                continue
            line, sep, rest = self.buffer.partition(b"\r\n")
            if not sep:
                break
            self.remaining = int(line.split(b";")[0], 16)
            self.buffer = rest
            if self.remaining == 0:
                self.buffer = b""
                break
        return out


async def sse_stream(spec: dict[str, Any], tally: Tally) -> None:
    reader, writer = await asyncio.open_connection(spec["host"], int(spec["port"]))
    writer.write(build_request({**spec, "path": f"{spec['path']}?n={int(spec['events'])}"}))
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    chunked = bool(_CHUNKED.search(head))
    decoder, text, seen, whole = Dechunker(), b"", 0, []
    while seen < int(spec["events"]):
        data = await reader.read(65536)
        now = time.time()
        if not data:
            break
        piece = decoder.feed(data) if chunked else data
        whole.append(piece)
        text += piece
        while b"\n\n" in text:
            event, _, text = text.partition(b"\n\n")
            if event.startswith(b"data: "):
                tally.latencies.append(max(0.0, now - float(json.loads(event[6:])["t"])))
                seen += 1
    tally.count(status, head, b"".join(whole))
    if seen < int(spec["events"]):
        tally.errors += 1
    writer.close()


async def sse(spec: dict[str, Any], tally: Tally) -> float:
    start = time.perf_counter()
    tasks = [asyncio.create_task(sse_stream(spec, tally)) for _ in range(int(spec.get("streams", 1)))]
    await asyncio.wait(tasks, timeout=float(spec["events"]) * 0.02 + MAX_WAIT)
    for task in tasks:
        if not task.done():
            tally.errors += 1
            task.cancel()
        elif task.exception() is not None:
            tally.errors += 1
    return time.perf_counter() - start


MODES = {"open": open_loop, "closed": closed_loop, "sse": sse}


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    tally = Tally(str(spec.get("secret", "")).encode())
    elapsed = await MODES[spec["mode"]](spec, tally)
    result = {"mode": spec["mode"], **tally.result(elapsed)}
    if spec.get("raw"):
        result["latencies_ms"] = [round(s * 1000, 4) for s in tally.latencies]
    return result


def main() -> None:
    spec = json.loads(sys.stdin.read())
    loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
    try:
        result = loop.run_until_complete(run(spec))
    finally:
        loop.close()
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
