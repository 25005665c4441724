"""Run-scoped credential sources: what issuing costs per run, and what it adds to a run's first
request (a benchmark, not a test).

    .venv/bin/python bench/sources.py               # 40 runs per source
    .venv/bin/python bench/sources.py --runs 200
    python -m bench.sources --smoke                 # 5 runs, what ./scripts/bench --smoke may run

Each source talks to its demo upstream on loopback (the demo GitHub App installation, the demo
OAuth provider on authlib), in-process, one core. Per run it measures the first ``get`` of the
per-run cache (the issuance call plus the credential's redaction forms, built in a thread) and a
cached ``get``; while the forms build it samples the event loop's lag with a 1 ms ticker, the stall
every other request would see. The App JWT is signed with a PEM key (the KV fallback): with a
transit key the signature is one Vault call per ``APP_JWT_REUSE`` seconds, not per run.
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


def forms(values: tuple[Secret, ...]) -> Redactor:
    raw = [v.reveal().encode() for v in values]
    return Redactor(raw, [b"Bearer " + v for v in raw])


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
    forms((Secret("ghs_warmup" + "x" * 30),))  # the first build pays one-time imports and caches
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
    forms_ms = statistics.median(_forms_cost() for _ in range(max(3, runs // 8)))
    return {"first_get_ms_median": statistics.median(first), "first_get_ms_p95": _p95(first),
            "cached_get_us_median": statistics.median(cached), "forms_ms_median": forms_ms,
            "loop_lag_ms_median": statistics.median(lags), "loop_lag_ms_p95": _p95(lags),
            "loop_lag_ms_max": max(lags)}


def _forms_cost() -> float:
    value = Secret("ghs_" + secrets.token_urlsafe(27)[:36])  # a fresh value: no compiled pattern cached
    start = time.perf_counter()
    forms((value,))
    return (time.perf_counter() - start) * 1000


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
    results = {"github_app": asyncio.run(bench_github(runs)), "oauth2": asyncio.run(bench_oauth(runs))}
    print(json.dumps({"runs": runs, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
