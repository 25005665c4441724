"""Revocation propagation: time from the revoke call returning to the first refused request at
each of N gateway replicas (real processes, real Redis pub/sub), at N = 1, 4, 8.

    python -m bench.revocation [--trials 30] [--replicas 1,4,8] [--json out.json]

Per trial: mint a run, warm every replica, start one poller per replica (each sends requests
back to back), call ``POST /v1/revocations`` for the run; when it returns, t0. A replica's
latency is the send time of its first request answered ``token_revoked``, minus t0 (a request
already in flight at t0 that comes back refused counts as 0). Reported: p50/p99 over all
replica-trials, and p50/p99 of the slowest replica per trial.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import httpx

from bench.stack import BenchStack


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def _trial(stack: BenchStack, client: httpx.AsyncClient) -> list[tuple[float, float]]:
    bundle = stack.mint(("read",))
    headers = {"Authorization": f"Bearer {bundle['env']['BENCH_TOKEN']}"}
    for url in stack.gateway_urls:
        (await client.get(f"{url}/v1/items/1", headers=headers)).raise_for_status()
    t0: list[float] = []
    done = asyncio.Event()

    async def poll(url: str) -> tuple[float, float]:
        while True:
            sent = time.perf_counter()
            try:
                response = await client.get(f"{url}/v1/items/1", headers=headers)
                refused = response.status_code == 401 and response.json().get("error") == "token_revoked"
            except httpx.RemoteProtocolError:
                refused = True  # a response in flight was cut by the revocation: that is a refusal
            if refused:
                if not t0:
                    await done.wait()
                return max(0.0, sent - t0[0]) * 1000, max(0.0, sent - t0[1]) * 1000
            if time.perf_counter() - sent > 10:
                raise RuntimeError("replica never refused")

    pollers = [asyncio.create_task(poll(url)) for url in stack.gateway_urls]
    await asyncio.sleep(0.02)
    started = time.perf_counter()
    response = await client.post(f"{stack.broker_url}/v1/revocations",
                                 json={"scope": "run", "name": bundle["run_id"], "reason": "bench"},
                                 headers={"X-Vault-Token": stack.vault.admin_token if stack.vault else ""})
    t0.extend([time.perf_counter(), started])
    done.set()
    response.raise_for_status()
    return list(await asyncio.gather(*pollers))


async def measure(replicas: int, trials: int) -> dict[str, Any]:
    with BenchStack(gateways=replicas) as stack:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=10, limits=limits) as client:
            await _trial(stack, client)  # warm-up, not counted
            per_replica: list[float] = []
            slowest: list[float] = []
            from_start: list[float] = []
            for _ in range(trials):
                latencies = await _trial(stack, client)
                per_replica += [after for after, _ in latencies]
                from_start += [since for _, since in latencies]
                slowest.append(max(after for after, _ in latencies))
    return {
        "replicas": replicas, "trials": trials,
        "p50_ms": round(percentile(per_replica, 50), 2), "p99_ms": round(percentile(per_replica, 99), 2),
        "slowest_p50_ms": round(percentile(slowest, 50), 2),
        "slowest_p99_ms": round(percentile(slowest, 99), 2),
        "max_ms": round(max(per_replica), 2), "mean_ms": round(statistics.fmean(per_replica), 2),
        "from_call_start_p50_ms": round(percentile(from_start, 50), 2),
        "from_call_start_p99_ms": round(percentile(from_start, 99), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--replicas", default="1,4,8")
    parser.add_argument("--json", dest="json_out", default="")
    args = parser.parse_args()
    results = [asyncio.run(measure(int(n), args.trials)) for n in args.replicas.split(",")]
    print("| replicas | trials | p50 (ms) | p99 (ms) | slowest replica p50 | slowest replica p99 | max | "
          "from call start p50 | from call start p99 |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['replicas']} | {r['trials']} | {r['p50_ms']} | {r['p99_ms']} | {r['slowest_p50_ms']} | "
              f"{r['slowest_p99_ms']} | {r['max_ms']} | {r['from_call_start_p50_ms']} | "
              f"{r['from_call_start_p99_ms']} |")
    if args.json_out:
        with open(args.json_out, "w") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
