"""Table 4: run tokens — verifications per second on one core, mints per second through Vault.

* **verify, distinct tokens** — thousands of tokens signed first (``TransitSigner`` directly, in
  batches), then each verified once by a fresh ``TokenVerifier`` (the gateway's own: strict JWS
  parse, Ed25519 signature, claims, run check), its ``KeyCache`` fed by the running broker's
  JWKS; the run check is the gateway's in-memory ``RevocationSet`` check (no I/O).
* **verify, one repeated token** — the same token again and again: the signature result is
  cached by token hash, claims and run checks still run on every call.
* **mints** — ``POST /v1/runs`` on the broker with ``concurrency`` requests in flight (caller
  lookup, policy, revocation check, transit signing, run record in Redis), driven by wrk (a
  separate C process) when installed, else by an httpx client in the harness's own process
  (which then competes with the broker and OpenBao for the same cores: the figure is lower).
* **raw signing** — ``TransitSigner.sign`` of one token per call with the same concurrency, and
  of batches (one Vault call signs the batch).
* **the floor** — a bare Ed25519 signature check (``cryptography``, the library under joserfc) of
  a token-sized message: no verifier can check distinct tokens faster than this on the machine.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bench.rss import Sampler, rss_mb
from bench.stack import ISSUER, UPSTREAM, BenchStack
from bench.tools import find_wrk, wrk
from broker.runs import new_run_id
from broker.signer import TransitSigner
from contract.claims import AccessClaims, GrantClaim, params_view
from contract.jwks import KeyCache, http_fetcher
from contract.revocations import RevocationSet
from contract.secret import Secret
from contract.vault import VaultClient
from contract.verify import TokenVerifier


def raw_ed25519_per_s(calls: int) -> float:
    key = Ed25519PrivateKey.generate()
    message = b"x" * 600  # about the signing input of a run token
    signature, public = key.sign(message), key.public_key()
    start = time.perf_counter()
    for _ in range(calls):
        public.verify(signature, message)
    return round(calls / (time.perf_counter() - start), 1)


def _claims(count: int) -> list[AccessClaims]:
    now = int(time.time())
    grants = (GrantClaim("read", params_view({})), GrantClaim("write", params_view({})))
    return [AccessClaims.new(issuer=ISSUER, run_id=new_run_id(), audience=UPSTREAM, runtime="bench-agent",
                             grants=grants, now=now, ttl=3600) for _ in range(count)]


async def _sign_many(signer: TransitSigner, count: int, batch: int) -> tuple[list[str], float]:
    tokens: list[str] = []
    start = time.perf_counter()
    for low in range(0, count, batch):
        tokens += await signer.sign(_claims(min(batch, count - low)))
    return tokens, time.perf_counter() - start


async def _verifier(http: httpx.AsyncClient, broker_url: str) -> TokenVerifier:
    keys = KeyCache(http_fetcher(f"{broker_url}/.well-known/jwks.json", http))
    await keys.refresh(force=True)
    revoked = RevocationSet()

    async def run_check(claims: AccessClaims) -> None:
        revoked.check(claims)

    return TokenVerifier(issuer=ISSUER, audience=UPSTREAM, keys=keys, run_check=run_check)


async def _concurrently(call: Any, concurrency: int, seconds: float) -> tuple[int, float]:
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await call()
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done, time.perf_counter() - start


async def measure(stack: BenchStack, *, distinct: int, repeated: int, rounds: int, seconds: float,
                  concurrency: int, batch: int = 250) -> dict[str, Any]:
    if stack.vault is None:
        raise RuntimeError("stack not started")
    vault = VaultClient(stack.vault.addr, Secret(stack.vault.broker_token))
    signer = TransitSigner(vault, "transit", "valetkey-tokens")
    out: dict[str, Any] = {"distinct_tokens": distinct, "repeated_calls": repeated, "rounds": rounds,
                           "concurrency": concurrency, "seconds": seconds, "batch": batch}
    try:
        tokens, signed_in = await _sign_many(signer, distinct, batch)
        out["batch_sign_per_s"] = [round(distinct / signed_in, 1)]
        async with httpx.AsyncClient(timeout=10) as http:
            out["verify_distinct_per_s"], out["verify_repeated_per_s"], out["raw_ed25519_per_s"] = [], [], []
            for _ in range(rounds):
                out["raw_ed25519_per_s"].append(raw_ed25519_per_s(distinct))
                verifier = await _verifier(http, stack.broker_url)
                start = time.perf_counter()
                for token in tokens:
                    await verifier.verify(token)
                out["verify_distinct_per_s"].append(round(len(tokens) / (time.perf_counter() - start), 1))
                verifier = await _verifier(http, stack.broker_url)
                await verifier.verify(tokens[0])  # the one signature check; the rest are cache hits
                start = time.perf_counter()
                for _ in range(repeated):
                    await verifier.verify(tokens[0])
                out["verify_repeated_per_s"].append(round(repeated / (time.perf_counter() - start), 1))

            one = _claims(1)

            async def sign_one() -> None:
                await signer.sign(one)

            out["sign_one_per_s"] = []
            for _ in range(rounds):
                done, elapsed = await _concurrently(sign_one, concurrency, seconds)
                out["sign_one_per_s"].append(round(done / elapsed, 1))
            for _ in range(rounds - 1):
                _, signed_in = await _sign_many(signer, distinct, batch)
                out["batch_sign_per_s"].append(round(distinct / signed_in, 1))
            out.update(await _mints(stack, http, rounds, seconds, concurrency))
    finally:
        await vault.aclose()
    return out


async def _mints(stack: BenchStack, http: httpx.AsyncClient, rounds: int, seconds: float,
                 concurrency: int) -> dict[str, Any]:
    if stack.vault is None or stack.broker is None:
        raise RuntimeError("stack not started")
    headers = {"X-Vault-Token": stack.vault.runtime_token("bench-agent")}
    body = {"grants": [{"upstream": UPSTREAM, "purpose": "read"}], "ttl": "1h"}
    failures: list[int] = []
    binary = find_wrk()

    async def mint() -> None:
        response = await http.post(f"{stack.broker_url}/v1/runs", json=body, headers=headers)
        if response.status_code != 201:
            failures.append(response.status_code)

    await mint()
    broker_pid = stack.broker.pid
    idle = rss_mb(broker_pid)
    rates: list[float] = []
    with Sampler(lambda: [broker_pid]) as sampler:
        for _ in range(rounds):
            if binary:  # wrk blocks: run it off the event loop
                result = await asyncio.to_thread(
                    wrk, binary, f"{stack.broker_url}/v1/runs", method="POST", headers=list(headers.items()),
                    body_size=0, connections=concurrency, duration=seconds, body=json.dumps(body).encode())
                if result["non200"] or result["errors"]:
                    raise RuntimeError(f"mints failed under wrk: {result['non200']} not 2xx, "
                                       f"{result['errors']} socket errors")
                rates.append(result["rps"])
                continue
            done, elapsed = await _concurrently(mint, concurrency, seconds)
            rates.append(round(done / elapsed, 1))
    if failures:
        raise RuntimeError(f"{len(failures)} mints failed: statuses {sorted(set(failures))}")
    return {"mint_per_s": rates, "mint_generator": "wrk" if binary else "httpx (in the harness's process)",
            "broker_rss_idle_mb": round(idle, 1), "broker_rss_load_mb": sampler.peak}
