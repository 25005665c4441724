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
        # several nodes of one cluster, comma-separated: a standby forwards to the active node, so
        # any live node will do; one that does not answer (or has no leader yet) is skipped
        self._addrs = [a.strip().rstrip("/") for a in addr.split(",") if a.strip()]
        self._current = 0
        self._token = token
        limits = httpx.Limits(max_connections=max_connections,
                              max_keepalive_connections=max_connections)
        self._http = httpx.AsyncClient(timeout=timeout, transport=transport, limits=limits)
        self.calls = 0  # requests made; tests use it to prove the hot path makes none

    @property
    def addr(self) -> str:
        """The node in use (the first that answered)."""
        return self._addrs[self._current]

    def __repr__(self) -> str:
        return f"VaultClient(addr={self.addr!r})"

    def set_token(self, token: Secret) -> None:
        self._token = token

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, json: Any = None) -> httpx.Response:
        self.calls += 1
        headers = {"X-Vault-Token": self._token.reveal(), "X-Vault-Request": "true"}
        failure = ""
        for _ in self._addrs:  # each node at most once, starting with the one that last answered
            addr = self.addr
            try:
                response = await self._http.request(method, f"{addr}/v1/{path}", json=json, headers=headers)
            except httpx.HTTPError as exc:
                failure = f"vault unreachable at {addr}: {type(exc).__name__}"
            else:
                if response.status_code < 500:
                    return response
                failure = f"vault error {response.status_code} on {path}"
            self._current = (self._current + 1) % len(self._addrs)
        raise Unavailable(failure, Reason.VAULT_UNAVAILABLE)

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
        return response.status_code in (200, 429)  # 429: a standby, which forwards to the active node

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

    async def kv_read(self, ref: SecretRef) -> Secret:
        data = await self._data("GET", ref.api_path)
        value = (data.get("data") or {}).get(ref.field)
        if not isinstance(value, str) or not value:
            raise UpstreamError(f"secret {ref.api_path} has no field {ref.field!r}")
        return Secret(value)

    async def issue_lease(self, path: str) -> tuple[dict[str, Any], str, int]:
        """Read a dynamic secret (``database/creds/<role>``): (data, lease id, lease seconds)."""
        response = await self._request("GET", path)
        if response.status_code != 200:
            raise UpstreamError(f"vault refused to issue {path} ({response.status_code})",
                                Reason.CREDENTIAL_SOURCE_REFUSED)
        body = _json(response)
        data, lease_id = body.get("data"), body.get("lease_id")
        if not isinstance(data, dict) or not isinstance(lease_id, str) or not lease_id:
            raise UpstreamError(f"vault answer for {path} has no lease", Reason.CREDENTIAL_SOURCE_REFUSED)
        return data, lease_id, int(body.get("lease_duration") or 0)

    async def renew_lease(self, lease_id: str, increment: int) -> int:
        """Renew a lease by ``increment`` seconds; returns the seconds it now has (Vault may cap it)."""
        response = await self._request("PUT", f"sys/leases/renew/{lease_id}", {"increment": increment})
        if response.status_code != 200:
            raise UpstreamError(f"vault refused to renew a lease ({response.status_code})",
                                Reason.CREDENTIAL_SOURCE_REFUSED)
        return int(_json(response).get("lease_duration") or 0)

    async def revoke_lease(self, lease_id: str) -> None:
        """Revoke a lease now (the engine's revocation statements run before Vault answers)."""
        response = await self._request("PUT", f"sys/leases/revoke/{lease_id}")
        if response.status_code not in (200, 204):
            raise UpstreamError(f"vault refused to revoke a lease ({response.status_code})",
                                Reason.CREDENTIAL_SOURCE_REFUSED)
    async def transit_sign_rs256(self, mount: str, key: str, message: bytes) -> bytes:
        """An RS256 signature (RSASSA-PKCS1-v1_5 with SHA-256) of ``message`` by a transit RSA key."""
        body = {"input": base64.b64encode(message).decode(), "hash_algorithm": "sha2-256",
                "signature_algorithm": "pkcs1v15"}
        data = await self._data("POST", f"{mount}/sign/{key}", body)
        sig = data.get("signature", "")
        if not isinstance(sig, str) or not sig.startswith("vault:v") or sig.count(":") != 2:
            raise UpstreamError("transit signing failed", Reason.SIGNING_FAILED)
        return base64.b64decode(sig.rsplit(":", 1)[1])

    async def kv_read_fields(self, mount: str, path: str) -> tuple[dict[str, Secret], int]:
        """Every field of a KV v2 secret (as secrets) and its version."""
        data = await self._data("GET", f"{mount}/data/{path}")
        fields = data.get("data") or {}
        version = (data.get("metadata") or {}).get("version", 0)
        return {k: Secret(v) for k, v in fields.items() if isinstance(v, str)}, int(version or 0)

    async def kv_write_field(self, ref: SecretRef, value: Secret) -> None:
        """Set one field of a KV v2 secret, keeping its other fields (check-and-set on the version
        read, so a concurrent writer is not overwritten silently)."""
        fields, version = await self.kv_read_fields(ref.mount, ref.path)
        body = {"options": {"cas": version},
                "data": {**{k: v.reveal() for k, v in fields.items()}, ref.field: value.reveal()}}
        response = await self._request("POST", ref.api_path, body)
        if response.status_code not in (200, 204):
            raise UpstreamError(f"vault refused writing {ref.api_path} with {response.status_code}",
                                Reason.VAULT_UNAVAILABLE)

    async def kv_put(self, mount: str, path: str, data: dict[str, str]) -> None:
        """Write a KV v2 entry (valetkey's own records, e.g. the durable revocations)."""
        response = await self._request("POST", f"{mount}/data/{path}", {"data": data})
        if response.status_code not in (200, 204):
            raise UpstreamError(f"vault refused writing {mount}/data/{path} with {response.status_code}",
                                Reason.VAULT_UNAVAILABLE)

    async def kv_get(self, mount: str, path: str) -> dict[str, Any] | None:
        """A KV v2 entry's data; None when there is none (or it was deleted)."""
        response = await self._request("GET", f"{mount}/data/{path}")
        if response.status_code == 404:
            return None
        data = await self._data_of(response, f"{mount}/data/{path}")
        inner = data.get("data")
        return inner if isinstance(inner, dict) else None

    async def kv_list(self, mount: str, path: str) -> list[str]:
        response = await self._request("LIST", f"{mount}/metadata/{path}")
        if response.status_code == 404:
            return []
        keys = (await self._data_of(response, f"{mount}/metadata/{path}")).get("keys")
        return [k for k in keys if isinstance(k, str)] if isinstance(keys, list) else []

    async def kv_delete(self, mount: str, path: str) -> None:
        """Delete every version of an entry."""
        response = await self._request("DELETE", f"{mount}/metadata/{path}")
        if response.status_code not in (200, 204, 404):
            raise UpstreamError(f"vault refused deleting {mount}/metadata/{path} with "
                                f"{response.status_code}", Reason.VAULT_UNAVAILABLE)

    async def _data_of(self, response: httpx.Response, path: str) -> dict[str, Any]:
        if response.status_code != 200:
            raise UpstreamError(f"vault refused {path} with {response.status_code}", Reason.VAULT_UNAVAILABLE)
        data = _json(response).get("data")
        return data if isinstance(data, dict) else {}

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
