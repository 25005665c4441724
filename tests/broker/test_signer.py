"""TransitSigner against a real OpenBao: concurrent mints share Vault calls (group commit), each
caller gets its own tokens, and a failure reaches every caller of the batch instead of hanging."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import pytest

from broker.runs import new_run_id
from broker.signer import TransitSigner
from contract.claims import AccessClaims, GrantClaim, params_view
from contract.errors import UpstreamError
from contract.jwks import jwks_from_transit, parse_jwks
from contract.secret import Secret
from contract.vault import VaultClient
from contract.verify import verify_signature


def claims(count: int) -> list[AccessClaims]:
    now = int(time.time())
    grants = (GrantClaim("read", params_view({})),)
    return [AccessClaims.new(issuer="http://broker.test", run_id=new_run_id(), audience="github", runtime="r",
                             grants=grants, now=now, ttl=600) for _ in range(count)]


def payload(token: str) -> dict[str, Any]:
    segment = token.split(".")[1]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
    return decoded


async def _concurrent(vault: VaultClient, key: str, sizes: list[int]) -> tuple[list[Any], int]:
    signer = TransitSigner(vault, "transit", key)
    wanted = [claims(n) for n in sizes]
    before = vault.calls
    results = await asyncio.gather(*(signer.sign(c) for c in wanted), return_exceptions=True)
    return [(c, r) for c, r in zip(wanted, results, strict=True)], vault.calls - before


def test_concurrent_mints_share_vault_calls(bootstrapped_vault: Any) -> None:
    async def case() -> None:
        vault = VaultClient(bootstrapped_vault.addr, Secret(bootstrapped_vault.broker_token))
        try:
            pairs, calls = await _concurrent(vault, "valetkey-tokens", [1, 2, 3] * 20)
            keys = parse_jwks(jwks_from_transit(await vault.transit_key("transit", "valetkey-tokens")))
        finally:
            await vault.aclose()
        assert calls < 20  # 60 callers (120 tokens): the first call goes alone, the rest batch up
        for wanted, tokens in pairs:
            assert [payload(t)["jti"] for t in tokens] == [c.jti for c in wanted]
            for token in tokens:
                header = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
                verify_signature(token, keys[header["kid"]].public_key)
    asyncio.run(case())


def test_a_failed_batch_fails_every_caller(bootstrapped_vault: Any) -> None:
    async def case() -> None:
        vault = VaultClient(bootstrapped_vault.addr, Secret(bootstrapped_vault.broker_token))
        try:
            async with asyncio.timeout(30):
                pairs, _ = await _concurrent(vault, "no-such-key", [1] * 10)
        finally:
            await vault.aclose()
        assert all(isinstance(result, UpstreamError) for _, result in pairs)
    asyncio.run(case())


def test_a_caller_that_goes_away_does_not_stop_the_others(bootstrapped_vault: Any) -> None:
    async def case() -> None:
        vault = VaultClient(bootstrapped_vault.addr, Secret(bootstrapped_vault.broker_token))
        signer = TransitSigner(vault, "transit", "valetkey-tokens")
        try:
            first = asyncio.create_task(signer.sign(claims(1)))
            await asyncio.sleep(0)
            waiting = [asyncio.create_task(signer.sign(claims(1))) for _ in range(5)]
            await asyncio.sleep(0)
            waiting[0].cancel()
            done = await asyncio.gather(first, *waiting[1:])
        finally:
            await vault.aclose()
        assert all(len(tokens) == 1 for tokens in done)
        with pytest.raises(asyncio.CancelledError):
            waiting[0].result()
    asyncio.run(case())


def test_callers_still_queued_when_the_signer_stops_are_answered(bootstrapped_vault: Any) -> None:
    """The flusher cancelled (loop shutdown): every caller waiting in its queue is cancelled too,
    none waits forever; a later sign starts a new flusher."""
    async def case() -> None:
        vault = VaultClient(bootstrapped_vault.addr, Secret(bootstrapped_vault.broker_token))
        signer = TransitSigner(vault, "transit", "valetkey-tokens")
        try:
            callers = [asyncio.create_task(signer.sign(claims(1))) for _ in range(6)]
            await asyncio.sleep(0)
            assert signer._flusher is not None
            signer._flusher.cancel()
            async with asyncio.timeout(10):
                results = await asyncio.gather(*callers, return_exceptions=True)
            assert all(isinstance(r, asyncio.CancelledError) for r in results)
            async with asyncio.timeout(10):
                assert len(await signer.sign(claims(2))) == 2
        finally:
            await vault.aclose()
    asyncio.run(case())
