"""Async Vault/OpenBao client for the request-serving paths (token lookup, transit, KV reads).

Administration (bootstrap, rotation) uses hvac; the serving paths use httpx so they share one
async connection pool. Every foreign error is translated here: transport failures and 5xx become
``Unavailable(vault_unavailable)``; a refused caller token becomes ``None`` from ``lookup_token``.
Neither tokens nor secret values appear in any message.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import httpx

from contract.errors import Reason, Unavailable, UpstreamError
from contract.secret import Secret
from policies.model import SecretRef

DEFAULT_TIMEOUT = httpx.Timeout(5.0, connect=2.0)


@dataclass(frozen=True)
class TransitKey:
    """Public view of a transit signing key: every live version's raw public key."""

    name: str
    latest_version: int
    min_version: int
    public_keys: dict[int, bytes]


class VaultClient:
    def __init__(
        self,
        addr: str,
        token: Secret,
        *,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
        max_connections: int = 100,
    ) -> None:
        self.addr = addr.rstrip("/")
        self._token = token
        limits = httpx.Limits(max_connections=max_connections,
                              max_keepalive_connections=max_connections)
        self._http = httpx.AsyncClient(
            base_url=f"{self.addr}/v1/", timeout=timeout, transport=transport, limits=limits
        )
        self.calls = 0  # requests made; tests use it to prove the hot path makes none

    def __repr__(self) -> str:
        return f"VaultClient(addr={self.addr!r})"

    def set_token(self, token: Secret) -> None:
        self._token = token

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, json: Any = None) -> httpx.Response:
        self.calls += 1
        headers = {"X-Vault-Token": self._token.reveal(), "X-Vault-Request": "true"}
        try:
            response = await self._http.request(method, path, json=json, headers=headers)
        except httpx.HTTPError as exc:
            raise Unavailable(
                f"vault unreachable at {self.addr}: {type(exc).__name__}",
                Reason.VAULT_UNAVAILABLE,
            ) from None
        if response.status_code >= 500:
            raise Unavailable(
                f"vault error {response.status_code} on {path}", Reason.VAULT_UNAVAILABLE
            )
        return response

    async def _data(self, method: str, path: str, json: Any = None) -> dict[str, Any]:
        response = await self._request(method, path, json)
        if response.status_code != 200:
            raise UpstreamError(
                f"vault refused {method} {path} with {response.status_code}",
                Reason.VAULT_UNAVAILABLE,
            )
        data = _json(response).get("data")
        if not isinstance(data, dict):
            raise UpstreamError(f"vault answer for {path} has no data", Reason.VAULT_UNAVAILABLE)
        return data

    async def healthy(self) -> bool:
        try:
            response = await self._request("GET", "sys/health")
        except Unavailable:
            return False
        return response.status_code == 200

    async def token_valid(self) -> bool:
        """Is our own token still accepted? (readiness: an expired broker token fails closed)."""
        try:
            response = await self._request("GET", "auth/token/lookup-self")
        except Unavailable:
            return False
        return response.status_code == 200

    async def create_run_token(self, role: str, ttl: int, meta: dict[str, str]) -> tuple[Secret, str]:
        """A Vault token from the run token role; returns (token, accessor)."""
        response = await self._request(
            "POST", f"auth/token/create/{role}", {"ttl": f"{ttl}s", "meta": meta, "no_parent": True}
        )
        auth = _json(response).get("auth") if response.status_code == 200 else None
        if not isinstance(auth, dict) or not auth.get("client_token"):
            raise UpstreamError(f"run token creation refused with {response.status_code}")
        return Secret(auth["client_token"]), str(auth["accessor"])

    async def revoke_accessor(self, accessor: str) -> None:
        response = await self._request("POST", "auth/token/revoke-accessor", {"accessor": accessor})
        if response.status_code not in (200, 204):
            raise UpstreamError(f"revoking a run's Vault token failed with {response.status_code}")

    async def lookup_token(self, token: str) -> dict[str, Any] | None:
        """Look up a caller's token with our own; None when Vault says it is not a valid token."""
        response = await self._request("POST", "auth/token/lookup", {"token": token})
        if response.status_code in (400, 403, 404):
            # Vault answers 403 "bad token" / 400 for unknown tokens; our own token being refused
            # shows up the same way and also fails closed (the caller is not authenticated).
            return None
        if response.status_code != 200:
            raise UpstreamError(f"token lookup failed with {response.status_code}")
        data = _json(response).get("data")
        return data if isinstance(data, dict) else None

    async def transit_key(self, mount: str, key: str) -> TransitKey:
        data = await self._data("GET", f"{mount}/keys/{key}")
        if data.get("type") != "ed25519":
            raise UpstreamError(f"transit key {key} is {data.get('type')!r}, not ed25519")
        latest = int(data["latest_version"])
        min_version = max(1, int(data.get("min_decryption_version") or 1))
        keys = {
            int(version): base64.b64decode(entry["public_key"])
            for version, entry in data.get("keys", {}).items()
            if min_version <= int(version) <= latest and entry.get("public_key")
        }
        return TransitKey(key, latest, min_version, keys)

    async def transit_sign(
        self, mount: str, key: str, messages: list[bytes], key_version: int
    ) -> list[bytes]:
        """Sign each message with one transit version (batched: one Vault call per run)."""
        body = {
            "key_version": key_version,
            "batch_input": [{"input": base64.b64encode(m).decode()} for m in messages],
        }
        data = await self._data("POST", f"{mount}/sign/{key}", body)
        out: list[bytes] = []
        for item in data.get("batch_results", []):
            sig = item.get("signature", "")
            prefix = f"vault:v{key_version}:"
            if item.get("error") or not sig.startswith(prefix):
                raise UpstreamError("transit signing failed", Reason.SIGNING_FAILED)
            out.append(base64.b64decode(sig[len(prefix) :]))
        if len(out) != len(messages):
            raise UpstreamError("transit returned a short batch", Reason.SIGNING_FAILED)
        return out

    async def kv_fields(self, mount: str, path: str) -> dict[str, Secret]:
        """Every string field of a KV v2 secret (each kept as a ``Secret``)."""
        data = await self._data("GET", f"{mount}/data/{path}")
        fields = data.get("data") or {}
        if not isinstance(fields, dict):
            return {}
        return {k: Secret(v) for k, v in fields.items() if isinstance(v, str)}

    async def kv_read(self, ref: SecretRef) -> Secret:
        data = await self._data("GET", ref.api_path)
        value = (data.get("data") or {}).get(ref.field)
        if not isinstance(value, str) or not value:
            raise UpstreamError(f"secret {ref.api_path} has no field {ref.field!r}")
        return Secret(value)

    async def approle_login(self, role_id: str, secret_id: Secret) -> tuple[Secret, int]:
        """Log in with AppRole; returns the client token and its lease in seconds."""
        response = await self._request(
            "POST", "auth/approle/login", {"role_id": role_id, "secret_id": secret_id.reveal()}
        )
        auth = _json(response).get("auth") if response.status_code == 200 else None
        if not isinstance(auth, dict) or not auth.get("client_token"):
            raise UpstreamError(f"approle login refused with {response.status_code}")
        return Secret(auth["client_token"]), int(auth.get("lease_duration") or 0)


def _json(response: httpx.Response) -> dict[str, Any]:
    """Vault's JSON answer; anything else (a proxy's error page) is Vault being unavailable."""
    try:
        body = response.json()
    except ValueError:
        raise Unavailable(f"vault answered {response.status_code} without JSON",
                          Reason.VAULT_UNAVAILABLE) from None
    return body if isinstance(body, dict) else {}
