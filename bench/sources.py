"""Run-scoped credential sources: what issuing costs per run, and what it adds to a run's first
request (a benchmark, not a test).

    .venv/bin/python bench/sources.py               # 40 runs per source
    .venv/bin/python bench/sources.py --runs 200
    python -m bench.sources --smoke                 # 5 runs, what ./scripts/bench --smoke may run

Each source talks to its demo upstream on loopback (the demo GitHub App installation, the demo
OAuth provider on authlib), in-process, one core. Per run it measures the first ``get`` of the
per-run cache (the issuance call plus the credential's redaction forms, built in steps on the
event loop) and a cached ``get``; while the forms build it samples the event loop's lag with a 1 ms
ticker, the stall every other request would see. ``learn`` isolates learning one fresh credential:
its forms built as the gateway builds them (``Redactor.build``: regexes spliced from cached
per-character pieces, in steps on the loop), the build it replaced in the same run (every pattern
through ``re.compile``, in a worker thread), the idle loop's lag over the same time, and the CPU
time of the build's longest step (what holds the loop, whatever else the machine runs). The App
JWT is signed with a PEM key (the KV fallback): with a transit key the signature is one Vault call
per ``APP_JWT_REUSE`` seconds, not per run. The demo upstreams run in this process: their work
(an RS256 check per issuance) adds to the ``github_app`` row's loop lag, not to a gateway's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from joserfc.jwk import RSAKey
from prometheus_client import CollectorRegistry

from contract.claims import AccessClaims, GrantClaim
from contract.secret import Secret
from gateways import spliced_regex
from gateways.redact import Redactor
from gateways.sources.cache import RunCredentials
from gateways.sources.github_app import GitHubApp
from gateways.sources.metrics import SourceMetrics
from gateways.sources.oauth2 import OAuth2
from policies.sources import GitHubAppSource, KvPath, OAuth2Source, OAuthGrant, SecretRef
from valetkey.dev.demo.github_app import AppInstallation
from valetkey.dev.demo.github_like import GitHubLike
from valetkey.dev.demo.oauth_provider import TOKEN_PATH, OAuthProvider
from valetkey.dev.services import free_port


class Serve:
    def __init__(self, app: Any) -> None:
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                access_log=False, lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class KeyVault:
    """The slice of VaultClient the sources read, from memory (the App key, the OAuth client)."""

    def __init__(self, pem: str) -> None:
        self.pem = pem

    async def kv_read(self, ref: SecretRef) -> Secret:
        return Secret(self.pem)

    async def kv_read_fields(self, mount: str, path: str) -> tuple[dict[str, Secret], int]:
        return {"client_id": Secret("bench"), "client_secret": Secret("bench-secret")}, 1


async def forms(values: tuple[Secret, ...]) -> Redactor:
    raw = [v.reveal().encode() for v in values]
    return await Redactor.build(raw, [b"Bearer " + v for v in raw])


def claims(run: int) -> AccessClaims:
    return AccessClaims(iss="bench", sub=f"run-{run}", aud="bench", exp=int(time.time()) + 3600, nbf=0,
                        iat=0, jti=str(run), client_id="bench",
                        grants=(GrantClaim("read_repo", {"owner": "acme", "repo": "widgets"}),))


async def lag_during(work: Any) -> tuple[Any, float]:
    """Run ``work`` while a 1 ms ticker measures the event loop's worst lag (ms)."""
    worst, done = 0.0, False

    async def tick() -> None:
        nonlocal worst
        while not done:
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, (time.perf_counter() - start - 0.001) * 1000)

    ticker = asyncio.create_task(tick())
    try:
        return await work, worst
    finally:
        done = True
        await ticker


async def measure(cache: RunCredentials[Redactor], runs: int) -> dict[str, float]:
    await Redactor.warm()  # as the gateway does at start-up
    await cache.start()
    first, cached, lags = [], [], []
    try:
        for run in range(runs):
            c = claims(run)
            start = time.perf_counter()
            _, lag = await lag_during(cache.get(c))
            first.append((time.perf_counter() - start) * 1000)
            lags.append(lag)
            start = time.perf_counter()
            for _ in range(100):
                await cache.get(c)
            cached.append((time.perf_counter() - start) / 100 * 1e6)
    finally:
        await cache.stop()
    forms_ms = statistics.median([await _forms_cost() for _ in range(max(3, runs // 8))])
    return {"first_get_ms_median": statistics.median(first), "first_get_ms_p95": _p95(first),
            "cached_get_us_median": statistics.median(cached), "forms_ms_median": forms_ms,
            "loop_lag_ms_median": statistics.median(lags), "loop_lag_ms_p95": _p95(lags),
            "loop_lag_ms_max": max(lags)}


async def _forms_cost() -> float:
    value = Secret("ghs_" + secrets.token_urlsafe(27)[:36])  # a fresh value: no compiled pattern cached
    start = time.perf_counter()
    await forms((value,))
    return (time.perf_counter() - start) * 1000


async def bench_learn(runs: int) -> dict[str, float]:
    """Learning one fresh credential (its forms), now and as before, with the loop's lag meanwhile
    and over the same time idle (ms)."""
    await Redactor.warm()
    built, lags, idle, threaded, threaded_lags = [], [], [], [], []
    for _ in range(runs):
        value = Secret("ghs_" + secrets.token_urlsafe(27)[:36])
        start = time.perf_counter()
        _, lag = await lag_during(forms((value,)))
        built.append((time.perf_counter() - start) * 1000)
        lags.append(lag)
        idle.append((await lag_during(asyncio.sleep(built[-1] / 1000)))[1])
    steps = [_longest_step() for _ in range(runs)]
    spliced_regex.SPLICING = False  # the build before: re.compile of every pattern, in a thread
    try:
        for _ in range(max(3, runs // 4)):
            raw = ("ghs_" + secrets.token_urlsafe(27)[:36]).encode()
            start = time.perf_counter()
            _, lag = await lag_during(asyncio.to_thread(Redactor, [raw], [b"Bearer " + raw]))
            threaded.append((time.perf_counter() - start) * 1000)
            threaded_lags.append(lag)
    finally:
        spliced_regex.SPLICING = True
    return {"forms_ms_median": statistics.median(built), "forms_ms_p99": _p99(built),
            "loop_lag_ms_median": statistics.median(lags), "loop_lag_ms_p99": _p99(lags),
            "loop_lag_ms_max": max(lags),
            "idle_loop_lag_ms_median": statistics.median(idle), "idle_loop_lag_ms_p99": _p99(idle),
            "idle_loop_lag_ms_max": max(idle),
            "longest_step_cpu_ms_median": statistics.median(steps), "longest_step_cpu_ms_p99": _p99(steps),
            "before_forms_ms_median": statistics.median(threaded),
            "before_loop_lag_ms_median": statistics.median(threaded_lags),
            "before_loop_lag_ms_max": max(threaded_lags)}


def _longest_step() -> float:
    """CPU time (ms) of the longest step of one build: how long it holds the loop at most, whatever
    else the machine runs (wall-clock lag also counts other processes' turns on the cores)."""
    raw = ("ghs_" + secrets.token_urlsafe(27)[:36]).encode()
    build = Redactor.__new__(Redactor)._build([raw], [b"Bearer " + raw])
    longest = 0.0
    while True:
        start = time.thread_time()
        done = next(build, StopIteration) is StopIteration
        longest = max(longest, time.thread_time() - start)
        if done:
            return longest * 1000


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]


async def bench_github(runs: int) -> dict[str, float]:
    key = RSAKey.generate_key(2048)
    app = AppInstallation("1", "2", key, "acme", {"widgets": 1}, {"metadata": "read", "contents": "write"})
    with Serve(GitHubLike("", app=app)) as url:
        config = GitHubAppSource(app_id="1", installation_id="2", api_url=url, transit_key=None,
                                 private_key=SecretRef("secret", "app", "pem"),
                                 permissions={"read_repo": {"contents": "read"}})
        import httpx
        source = GitHubApp(config, KeyVault(key.as_pem(private=True).decode()),  # type: ignore[arg-type]
                           httpx.AsyncClient(timeout=10, trust_env=False))
        cache = RunCredentials(source, "bench", SourceMetrics(CollectorRegistry()), forms)
        result = await measure(cache, runs)
    result["revoked_at_stop"] = float(app.revoked)
    return result


async def bench_oauth(runs: int) -> dict[str, float]:
    provider = OAuthProvider(expires_in=3600)
    provider.register("bench", "bench-secret")
    with Serve(provider) as url:
        config = OAuth2Source(token_url=url + TOKEN_PATH, grant=OAuthGrant.CLIENT_CREDENTIALS,
                              client=KvPath("secret", "oauth"))
        source = OAuth2(config, KeyVault(""))  # type: ignore[arg-type]
        cache = RunCredentials(source, "bench", SourceMetrics(CollectorRegistry()), forms)
        start = time.perf_counter()
        await source.start()
        fetch = [(await _timed(source.issue(claims(0)))) for _ in range(max(3, runs // 4))]
        await source.stop()
        result = await measure(cache, runs)  # shared: the first run issues, the others hit the cache
        result["token_fetch_ms_median"] = statistics.median(fetch)
        result["setup_ms"] = (time.perf_counter() - start) * 1000
    return result


async def _timed(work: Any) -> float:
    start = time.perf_counter()
    await work
    return (time.perf_counter() - start) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--smoke", action="store_true", help="5 runs per source")
    args = parser.parse_args(argv)
    runs = 5 if args.smoke else args.runs
    results = {"learn": asyncio.run(bench_learn(max(runs, 10) * 2)),
               "github_app": asyncio.run(bench_github(runs)), "oauth2": asyncio.run(bench_oauth(runs))}
    print(json.dumps({"runs": runs, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
