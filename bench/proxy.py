"""Table 1: what injecting the credential costs — direct, nginx, mitmproxy and the valetkey gateway
(one worker; as many workers as cores) against the same fast upstream, measured in the same run.

Per round, every target in turn (the order rotates each round) gets, for the small request (GET,
~200-byte JSON) and the medium one (POST 16 KB, 64 KB answer):

* **throughput** — closed loop at fixed concurrency: wrk (one thread), or the harness's own
  closed-loop generator where wrk is not installed (the table says which);
* **latency** — open loop at a fixed moderate rate (``bench.loadgen``: requests scheduled at fixed
  intervals, latency from the intended send time), p50 and p99.

The gateway is sent the run's placeholder token; direct calls carry the real secret; nginx and
mitmproxy are sent the placeholder and overwrite it. Any non-200 (the upstream answers 401 unless
the injected secret arrived) fails the run, and so does the secret in any response the
open-loop and closed-loop generators read (every response of the latency runs).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from bench.rss import Sampler, cpu_seconds
from bench.tools import wrk


class BenchFailure(RuntimeError):
    """The harness refused a result: a non-200, a leaked secret, or a generator error."""


@dataclass(frozen=True)
class Kind:
    name: str
    method: str
    path: str
    body_size: int
    what: str


KINDS = {
    "small": Kind("small", "GET", "/v1/items/1", 0, "GET, ~200-byte JSON answer"),
    "medium": Kind("medium", "POST", "/v1/items/1", 16384, "POST 16 KB JSON, 64 KB answer"),
}


@dataclass
class Target:
    name: str
    label: str
    url: str
    auth: str  # the Authorization value the client sends
    pids: Callable[[], list[int]] | None = None  # sampled for RSS and CPU under load
    diagnose: Callable[[], str] | None = None  # what the target itself says about a failure


@dataclass(frozen=True)
class Plan:
    rounds: int = 3
    seconds: float = 8.0  # each throughput run
    connections: int = 32
    latency_seconds: float = 8.0  # each open-loop run
    rates: dict[str, float] = field(default_factory=lambda: {"small": 100.0, "medium": 50.0})
    warmup: float = 2.0


def run_loadgen(spec: dict[str, Any]) -> dict[str, Any]:
    """Run ``bench.loadgen`` in its own process and return its JSON result."""
    timeout = float(spec.get("duration", 0)) + float(spec.get("events", 0)) * 0.05 + 90
    done = subprocess.run([sys.executable, "-m", "bench.loadgen"], input=json.dumps(spec),
                          capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise BenchFailure(f"load generator failed: {done.stderr[-800:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def spec_for(url: str, auth: str, kind: Kind, secret: str, **extra: Any) -> dict[str, Any]:
    parts = urlsplit(url)
    return {"host": parts.hostname, "port": parts.port, "method": kind.method, "path": kind.path,
            "body_size": kind.body_size, "headers": [["Authorization", auth]], "secret": secret, **extra}


def checked(result: dict[str, Any], where: str) -> dict[str, Any]:
    if result.get("non200"):
        raise BenchFailure(f"{where}: {result['non200']} responses were not 200 "
                           f"({result.get('statuses', {})}); the upstream answers 401 without the secret")
    if result.get("leaks"):
        raise BenchFailure(f"{where}: the secret appeared in {result['leaks']} responses to the client")
    if result.get("errors") and not result.get("completed", result.get("requests")):
        raise BenchFailure(f"{where}: every request failed ({result['errors']} errors)")
    return result


def throughput(wrk_binary: str | None, url: str, auth: str, kind: Kind, connections: int, seconds: float,
               secret: str) -> dict[str, Any]:
    """Max throughput at fixed concurrency: wrk if installed, else the closed-loop generator."""
    if wrk_binary:
        result = wrk(wrk_binary, url + kind.path, method=kind.method, headers=[("Authorization", auth)],
                     body_size=kind.body_size, connections=connections, duration=seconds)
        return {**result, "generator": "wrk"}
    result = run_loadgen(spec_for(url, auth, kind, secret, mode="closed", connections=connections,
                                  duration=seconds))
    return {**result, "generator": "python closed loop"}


def latency(url: str, auth: str, kind: Kind, rate: float, seconds: float, secret: str) -> dict[str, Any]:
    return run_loadgen(spec_for(url, auth, kind, secret, mode="open", rate=rate, duration=seconds,
                                connections=64))


def settle(pids: Callable[[], list[int]], limit: float = 10.0) -> None:
    """Wait until the target has drained the last run's backlog (a proxy keeps serving requests
    whose client already left): its CPU use over 200 ms below 5 % of a core, or ``limit`` passed."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        before = cpu_seconds(pids())
        time.sleep(0.2)
        if cpu_seconds(pids()) - before < 0.01:
            return


def warm(targets: list[Target], plan: Plan, secret: str) -> None:
    """Proof before load (200, no secret in the answer) and a warm-up that is not counted."""
    for t in targets:
        for kind in KINDS.values():
            checked(run_loadgen(spec_for(t.url, t.auth, kind, secret, mode="closed", connections=4,
                                         duration=plan.warmup)), f"{t.label} warm-up ({kind.name})")


def compare(targets: list[Target], plan: Plan, wrk_binary: str | None, secret: str,
            log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every target, kind and measurement, ``plan.rounds`` times interleaved; raw per-round figures."""
    raw: dict[str, dict[str, dict[str, list[Any]]]] = {
        t.name: {k: {"rps": [], "p50": [], "p99": [], "lateness_p99": [], "rss_peak": [], "errors": [],
                     "cpu_ms": []}
                 for k in KINDS} for t in targets}
    generator = "wrk" if wrk_binary else "python closed loop"
    for r in range(plan.rounds):
        order = targets[r % len(targets):] + targets[:r % len(targets)]
        for t in order:
            for kind in KINDS.values():
                where = f"round {r + 1}, {t.label}, {kind.name}"
                pids = t.pids or (lambda: [])
                sampler = Sampler(pids)
                cpu_before = cpu_seconds(pids())
                try:
                    with sampler:
                        tp = checked(throughput(wrk_binary, t.url, t.auth, kind, plan.connections,
                                                plan.seconds, secret), f"{where}, throughput")
                    cpu = cpu_seconds(pids()) - cpu_before
                    requests = tp.get("requests") or tp.get("completed") or 0
                    settle(pids)
                    lat = checked(latency(t.url, t.auth, kind, plan.rates[kind.name], plan.latency_seconds,
                                          secret), f"{where}, latency")
                except BenchFailure as exc:
                    if t.diagnose is None:
                        raise
                    raise BenchFailure(f"{exc}; {t.diagnose()}") from None
                cell = raw[t.name][kind.name]
                cell["rps"].append(tp["rps"])
                cell["p50"].append(lat["latency_ms"]["p50"])
                cell["p99"].append(lat["latency_ms"]["p99"])
                cell["lateness_p99"].append(lat["lateness_ms"]["p99"])
                cell["rss_peak"].append(sampler.peak)
                cell["cpu_ms"].append(round(1000 * cpu / requests, 3) if requests else 0.0)
                cell["errors"].append(tp.get("errors", 0) + lat.get("errors", 0))
                log(f"  {where}: {tp['rps']:,.0f} req/s; p50 {lat['latency_ms']['p50']:.2f} ms, "
                    f"p99 {lat['latency_ms']['p99']:.2f} ms at {plan.rates[kind.name]:g}/s")
    return {"raw": raw, "generator": generator, "labels": {t.name: t.label for t in targets},
            "plan": {"rounds": plan.rounds, "seconds": plan.seconds, "connections": plan.connections,
                     "latency_seconds": plan.latency_seconds, "rates": plan.rates}}


def med(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def ratios(raw: dict[str, dict[str, dict[str, list[Any]]]], a: str, b: str, kind: str,
           metric: str = "rps") -> list[float]:
    """Per-round ratio a/b (each round's figures were taken minutes apart, not hours)."""
    if a not in raw or b not in raw:
        return []
    return [x / y for x, y in zip(raw[a][kind][metric], raw[b][kind][metric], strict=True) if y]


def added(raw: dict[str, dict[str, dict[str, list[Any]]]], a: str, kind: str, metric: str) -> list[float]:
    """Per-round latency added by ``a`` over direct (ms)."""
    if a not in raw or "direct" not in raw:
        return []
    return [x - y for x, y in zip(raw[a][kind][metric], raw["direct"][kind][metric], strict=True)]
