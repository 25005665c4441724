"""The soak: a one-worker gateway under a moderate open-loop load for minutes, its RSS sampled.

    python -m bench.soak [--minutes 10] [--rate 50] [--interval 5] [--doc docs/benchmarks.md]

Two open-loop generators run side by side — the small request at ``rate`` per second and the
medium one at a quarter of it — while the gateway's and the broker's VmRSS are sampled every
``interval`` seconds. Reported: first, last, min and max, and the least-squares slope over the
whole soak and over its second half (after allocator and caches settled). The RSS is called flat
when the second-half slope is at most ``FLAT_MB_PER_MIN``. As everywhere in the harness, any
non-200 or a secret in a response fails the run.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import Any

from bench import docfile
from bench.proxy import KINDS, BenchFailure, Plan, Target, checked, run_loadgen, spec_for, warm
from bench.rss import Sampler
from bench.stack import BenchStack
from bench.tables import num, table

FLAT_MB_PER_MIN = 0.1  # at most 1 MB per 10 minutes once settled


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope in MB per minute of (seconds, MB) samples."""
    if len(points) < 2:
        return 0.0
    xs, ys = [t / 60 for t, _ in points], [mb for _, mb in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def summarize(points: list[tuple[float, float]]) -> dict[str, float]:
    mbs = [mb for _, mb in points] or [0.0]
    half = points[len(points) // 2:]
    return {"first": mbs[0], "last": mbs[-1], "min": min(mbs), "max": max(mbs),
            "slope_mb_per_min": round(slope(points), 4), "slope_second_half": round(slope(half), 4)}


def soak(minutes: float, rate: float, interval: float) -> dict[str, Any]:
    seconds = minutes * 60
    with BenchStack() as stack:
        token = stack.mint(ttl=f"{max(60, round(minutes) + 30)}m")["env"]["BENCH_TOKEN"]
        gateway = stack.gateway_procs[0].pid
        broker = stack.broker.pid if stack.broker else 0
        target = Target("gateway-1", "valetkey gateway, 1 worker", stack.gateway_urls[0], f"Bearer {token}")
        warm([target], Plan(warmup=2.0), stack.secret)
        results: dict[str, dict[str, Any]] = {}

        def drive(kind: str, per_second: float) -> None:
            try:
                results[kind] = run_loadgen(spec_for(target.url, target.auth, KINDS[kind], stack.secret,
                                                     mode="open", rate=per_second, duration=seconds,
                                                     connections=64))
            except BenchFailure as exc:
                results[kind] = {"failure": str(exc)}

        drivers = [threading.Thread(target=drive, args=("small", rate)),
                   threading.Thread(target=drive, args=("medium", rate / 4))]
        with Sampler(lambda: [gateway], interval) as gw_rss, Sampler(lambda: [broker], interval) as br_rss:
            for thread in drivers:
                thread.start()
            for thread in drivers:
                thread.join(timeout=seconds + 180)
    for kind, result in results.items():
        if "failure" in result:
            raise BenchFailure(f"soak, {kind}: {result['failure']}")
        checked(result, f"soak, {kind}")
    return {"minutes": minutes, "rate": rate, "interval": interval,
            "gateway": summarize(gw_rss.samples), "broker": summarize(br_rss.samples),
            "timeline": [(round(t), mb) for t, mb in gw_rss.samples],
            "requests": {k: r["completed"] for k, r in results.items()},
            "latency_ms": {k: r["latency_ms"] for k, r in results.items()},
            "errors": sum(int(r["errors"]) for r in results.values())}


def markdown(result: dict[str, Any], machine: dict[str, str]) -> str:
    rows = []
    for name in ("gateway", "broker"):
        s = result[name]
        rows.append([f"{name} (1 worker)" if name == "gateway" else name, num(s["first"]), num(s["last"]),
                     num(s["min"]), num(s["max"]), f"{s['slope_mb_per_min']:+.3f}",
                     f"{s['slope_second_half']:+.3f}"])
    flat = abs(result["gateway"]["slope_second_half"]) <= FLAT_MB_PER_MIN
    every = max(1, round(60 / result["interval"]))
    timeline = ", ".join(f"{t // 60} min: {mb:.1f}" for t, mb in result["timeline"][::every])
    lat = result["latency_ms"]
    return "\n\n".join([
        "## Soak",
        f"`./scripts/bench soak --minutes {result['minutes']:g}` on {machine['date']} "
        "(same machine as above): "
        f"one gateway worker for {result['minutes']:g} minutes under an open-loop load of "
        f"{result['rate']:g} small + {result['rate'] / 4:g} medium requests per second "
        f"({sum(result['requests'].values()):,} requests, all 200, {result['errors']} transport errors; "
        f"p50/p99 {lat['small']['p50']:.2f}/{lat['small']['p99']:.2f} ms small, "
        f"{lat['medium']['p50']:.2f}/{lat['medium']['p99']:.2f} ms medium). VmRSS in MB, sampled every "
        f"{result['interval']:g} s; slopes in MB per minute (least squares).",
        table(["process", "first", "last", "min", "max", "slope", "slope, second half"], rows),
        f"Gateway RSS per minute: {timeline}.",
        f"Target *gateway RSS flat under the soak*: **{'met' if flat else 'missed'}** (second-half slope "
        f"{result['gateway']['slope_second_half']:+.3f} MB/min; flat means within "
        f"±{FLAT_MB_PER_MIN} MB/min)."])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=50.0, help="small requests per second")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--doc", type=Path, help="splice the soak section into this Markdown file")
    parser.add_argument("--json", type=Path, help="write the raw result here")
    args = parser.parse_args()
    try:
        result = soak(args.minutes, args.rate, args.interval)
    except BenchFailure as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    text = markdown(result, docfile.machine())
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if args.doc:
        docfile.splice(args.doc, "soak", text)
    else:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
