"""Mints under a burst: N concurrent ``POST /v1/runs`` at once, and what the broker answers.

    python -m bench.mints_curve [--levels 50,200,1000,2000] [--json FILE]

Starts a stack (OpenBao dev, Redis, bootstrap, the broker as ``valetkey broker serve``), then for
each level fires that many mints at the same moment, each on its own connection (raw asyncio
sockets, ``Connection: close``: a burst of new clients, not a keep-alive pool), one runtime token
for all of them as an orchestrator would. While the burst runs it polls ``/readyz`` every 100 ms.
Right after each burst it mints a few more ("rerun"): the broker must serve at once again.

Each answer is counted by status and reason code: ``201``, ``503 broker_overloaded`` (admission
control refused it fast, with ``Retry-After``) and anything else (which the broker should never
answer). Latency runs from the connect to the last byte. The load generator shares the machine's
cores with the broker and OpenBao: the figures are this machine's, not the broker's alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from bench.loadgen import percentile

OVERLOADED = "broker_overloaded"


@dataclass(frozen=True)
class Answer:
    status: int  # 0: no HTTP answer (connection refused, reset, timed out)
    error: str  # the reason code of an error body, or the exception name when status is 0
    retry_after: str
    seconds: float


@dataclass
class Burst:
    answers: list[Answer] = field(default_factory=list)
    readyz: list[tuple[int, float]] = field(default_factory=list)  # (status, seconds) per probe

    def count(self, status: int, error: str = "") -> int:
        return sum(1 for a in self.answers if a.status == status and (not error or a.error == error))

    @property
    def created(self) -> int:
        return self.count(201)

    @property
    def overloaded(self) -> list[Answer]:
        return [a for a in self.answers if a.status == 503 and a.error == OVERLOADED]

    @property
    def other(self) -> Counter[str]:
        """Every answer that is neither a 201 nor a 503 broker_overloaded."""
        return Counter(f"{a.status} {a.error}".strip() for a in self.answers
                       if a.status != 201 and not (a.status == 503 and a.error == OVERLOADED))

    def summary(self) -> dict[str, Any]:
        ok = [a.seconds * 1000 for a in self.answers if a.status == 201]
        refused = [a.seconds * 1000 for a in self.overloaded]
        probes = [s * 1000 for _, s in self.readyz]
        return {
            "requests": len(self.answers), "created": self.created, "overloaded": len(refused),
            "other": dict(self.other),
            "created_ms": {"p50": round(percentile(ok, 50), 1), "p99": round(percentile(ok, 99), 1)},
            "overloaded_ms": {"p50": round(percentile(refused, 50), 1),
                              "p99": round(percentile(refused, 99), 1)},
            "readyz": {"probes": len(probes), "ok": sum(1 for s, _ in self.readyz if s == 200),
                       "max_ms": round(max(probes, default=0.0), 1)},
        }


def _request(host: str, path: str, token: str, body: bytes) -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nX-Vault-Token: {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


def _parse(raw: bytes, started: float) -> Answer:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    headers = dict(line.lower().split(":", 1) for line in lines[1:] if ":" in line)
    error = ""
    if status >= 400:
        try:
            error = str(json.loads(body).get("error", ""))
        except ValueError:
            error = "unreadable_body"
    return Answer(status, error, headers.get("retry-after", "").strip(), time.perf_counter() - started)


async def mint_once(url: str, token: str, body: bytes, limit: float) -> Answer:
    """One mint on a connection of its own; never raises (a failure is an answer with status 0)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    started = time.perf_counter()
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(limit):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(_request(f"{host}:{port}", "/v1/runs", token, body))
            raw = await reader.read(-1)
    except (OSError, TimeoutError) as exc:
        return Answer(0, type(exc).__name__, "", time.perf_counter() - started)
    finally:
        if writer is not None:
            writer.close()
    return _parse(raw, started)


async def _poll_ready(url: str, stop: asyncio.Event, out: list[tuple[int, float]], every: float) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    while not stop.is_set():
        started = time.perf_counter()
        status = 0
        try:
            async with asyncio.timeout(5.0):
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(f"GET /readyz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
                raw = await reader.read(-1)
                writer.close()
            status = _parse(raw, started).status
        except (OSError, TimeoutError):
            pass
        out.append((status, time.perf_counter() - started))
        await asyncio.sleep(every)


async def burst(url: str, token: str, body: dict[str, Any], concurrency: int, *, limit: float = 30.0,
                ready_every: float = 0.1) -> Burst:
    """``concurrency`` mints started at once (each given ``limit`` seconds), and /readyz polled
    until the last one answered."""
    result = Burst()
    stop = asyncio.Event()
    payload = json.dumps(body).encode()
    poller = asyncio.create_task(_poll_ready(url, stop, result.readyz, ready_every))
    try:
        result.answers = list(await asyncio.gather(
            *(mint_once(url, token, payload, limit) for _ in range(concurrency))))
    finally:
        stop.set()
        await poller
    return result


async def curve(url: str, token: str, body: dict[str, Any], levels: list[int],
                rerun: int = 20) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for level in levels:
        first = await burst(url, token, body, level)
        again = await burst(url, token, body, rerun)
        rows.append({"concurrency": level, **first.summary(),
                     "rerun": {"requests": rerun, "created": again.created}})
        await asyncio.sleep(1.0)  # let the broker settle between levels
    return rows


def main() -> None:
    from bench.stack import UPSTREAM, BenchStack

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="50,200,1000,2000")
    parser.add_argument("--json", default="", help="also write the rows to this file")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",") if x]
    with BenchStack(gateways=0) as stack:
        if stack.vault is None:
            raise RuntimeError("stack not started")
        token = stack.vault.runtime_token("bench-agent")
        body = {"grants": [{"upstream": UPSTREAM, "purpose": "read"}], "ttl": "1h"}
        rows = asyncio.run(curve(stack.broker_url, token, body, levels))
    text = json.dumps(rows, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
