"""Caller authentication: a sandbox runtime proves who it is with its own Vault token.

The broker looks the token up in Vault with the broker's token and maps what Vault says
(policies, AppRole role, entity) to exactly one runtime in policy, or to the security-team role
(a Vault policy named in settings). Results are cached briefly by token hash, never by the raw
token, and concurrent requests with the same uncached token share one lookup (a burst of mints
from one orchestrator makes one Vault call, not one per request). Unknown or ambiguous callers
are refused.

When Vault cannot say who the caller is — unreachable, sealed, or refusing the broker's own token
(expired, or a Vault that lost its state) — the answer is ``503 vault_unavailable``, never
``401 unknown_caller``: the caller is refused either way, and the error names the broken party.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from contract.errors import Forbidden, Reason, Unauthenticated, Unavailable
from contract.secret import token_hash
from contract.vault import VaultClient
from policies.model import PolicySet, Runtime

MAX_CALLER_TOKEN = 1024
NEGATIVE_TTL = 5.0
CACHE_SIZE = 10_000
SELF_CHECK_TTL = 5.0  # seconds a confirmation that Vault accepts the broker's own token is reused


@dataclass(frozen=True)
class Caller:
    name: str  # runtime name, or "admin:<accessor>" for the security team
    runtime: Runtime | None
    is_admin: bool
    accessor: str = ""
    groups: frozenset[str] = frozenset()  # approver groups of the enterprise document it belongs to

    def may_decide(self, approvers: str) -> bool:
        """The security team decides every approval; a group member only its group's."""
        return self.is_admin or (bool(approvers) and approvers in self.groups)

    def require_admin_or_approver(self) -> None:
        if not (self.is_admin or self.groups):
            raise Forbidden("approvals are decided by the security team (admin policy) or by the members "
                            "of an approver group of the enterprise policy", Reason.NOT_APPROVER)

    def require_admin(self) -> None:
        if not self.is_admin:
            raise Forbidden(
                f"this token identifies runtime {self.name!r}, not the security team: revocations, "
                "audit and other runtimes' runs need a token carrying the admin Vault policy "
                "(VALETKEY_ADMIN_POLICY, valetkey-admin by default)", Reason.NOT_ADMIN,
            )

    def require_runtime(self) -> Runtime:
        if self.runtime is None:
            raise Forbidden(
                "this token is the security team's (admin policy), not a runtime's: only a runtime "
                "may create runs; use the token of the runtime the run is for", Reason.UNKNOWN_CALLER,
            )
        return self.runtime


def caller_token(headers: Mapping[str, str]) -> str:
    """The caller's Vault token from ``X-Vault-Token`` or ``Authorization: Bearer``."""
    token = headers.get("x-vault-token", "")
    auth = headers.get("authorization", "")
    if not token and auth[:7].lower() == "bearer ":
        token = auth[7:].strip()
    if not token:
        raise Unauthenticated("send your Vault token as Authorization: Bearer or X-Vault-Token")
    if len(token) > MAX_CALLER_TOKEN or not token.isascii() or not token.isprintable():
        raise Unauthenticated("malformed caller token", Reason.UNKNOWN_CALLER)
    return token


def identify(info: Mapping[str, Any], policies: PolicySet, admin_policy: str) -> Caller:
    """Map a Vault token lookup to a caller; pure function (the table tests drive it)."""
    held = set(info.get("policies") or []) | set(info.get("identity_policies") or [])
    meta = info.get("meta") or {}
    role = meta.get("role_name", "") if str(info.get("path", "")).startswith("auth/approle/") else ""
    entity = info.get("entity_id") or ""
    accessor = str(info.get("accessor", ""))
    matches = [
        rt for rt in policies.runtimes.values()
        if (rt.identity.vault_policy and rt.identity.vault_policy in held)
        or (rt.identity.approle_role and rt.identity.approle_role == role)
        or (rt.identity.entity_id and rt.identity.entity_id == entity)
    ]
    is_admin = admin_policy in held
    groups = frozenset(g.name for g in policies.enterprise.approvers.values() if g.vault_policy in held)
    if len(matches) > 1:
        raise Unauthenticated("caller matches more than one runtime", Reason.AMBIGUOUS_CALLER)
    if not matches and not is_admin and groups:
        who = str(info.get("display_name") or "") or accessor[:12]
        return Caller(name=f"approver:{who}", runtime=None, is_admin=False, accessor=accessor, groups=groups)
    if not matches and not is_admin:
        raise Unauthenticated(
            f"caller is not a known runtime: this Vault token carries policies {sorted(held)}, "
            f"none of which identifies a runtime ({_identities(policies)}) or the security team "
            f"({admin_policy!r})", Reason.UNKNOWN_CALLER,
        )
    runtime = matches[0] if matches else None
    name = runtime.name if runtime else f"admin:{accessor[:12]}"
    return Caller(name=name, runtime=runtime, is_admin=is_admin, accessor=accessor, groups=groups)


def _identities(policies: PolicySet) -> str:
    """What each runtime is known by, for the message that says a token matches none of them."""
    named = []
    for rt in policies.runtimes.values():
        ident = rt.identity
        how = (f"policy {ident.vault_policy!r}" if ident.vault_policy
               else f"AppRole role {ident.approle_role!r}" if ident.approle_role else "an entity")
        named.append(f"{rt.name}: {how}")
    return "; ".join(named) or "no runtime in policy"


class CallerAuthenticator:
    def __init__(
        self, vault: VaultClient, policies: PolicySet, admin_policy: str, cache_ttl: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._vault = vault
        self._policies = policies
        self._admin_policy = admin_policy
        self._ttl = cache_ttl
        self._clock = clock
        self._cache: OrderedDict[str, tuple[float, Caller | Unauthenticated]] = OrderedDict()
        self._lookups: dict[str, asyncio.Task[Caller]] = {}
        self._self_ok_until = 0.0

    async def authenticate(self, headers: Mapping[str, str]) -> Caller:
        token = caller_token(headers)
        key = token_hash(token)
        hit = self._cache.get(key)
        if hit is not None and hit[0] > self._clock():
            if isinstance(hit[1], Unauthenticated):
                raise Unauthenticated(hit[1].detail, hit[1].reason)
            return hit[1]
        lookup = self._lookups.get(key)
        if lookup is None:
            lookup = asyncio.create_task(self._lookup(token, key), name="caller-lookup")
            self._lookups[key] = lookup
            lookup.add_done_callback(lambda done: self._settled(key, done))
        # shielded: a caller that hangs up does not cancel the lookup the others wait for
        return await asyncio.shield(lookup)

    def _settled(self, key: str, lookup: asyncio.Task[Caller]) -> None:
        if self._lookups.get(key) is lookup:
            del self._lookups[key]
        if not lookup.cancelled():
            lookup.exception()  # retrieved here, so a lookup nobody awaits any more logs nothing

    async def _vault_accepts_broker(self) -> bool:
        if self._clock() < self._self_ok_until:
            return True
        if not await self._vault.token_valid():
            return False
        self._self_ok_until = self._clock() + SELF_CHECK_TTL
        return True

    async def _lookup(self, token: str, key: str) -> Caller:
        info = await self._vault.lookup_token(token)
        if info is None and not await self._vault_accepts_broker():
            raise Unavailable("Vault refuses the broker's own token (expired or revoked, or Vault lost "
                              "its state): callers cannot be looked up", Reason.VAULT_UNAVAILABLE)
        try:
            if info is None:
                raise Unauthenticated("caller token is not valid in Vault", Reason.UNKNOWN_CALLER)
            caller = identify(info, self._policies, self._admin_policy)
        except Unauthenticated as exc:
            self._remember(key, exc, NEGATIVE_TTL)
            raise
        ttl = self._ttl
        remaining = info.get("ttl")
        if isinstance(remaining, int) and remaining > 0:
            ttl = min(ttl, remaining)
        self._remember(key, caller, ttl)
        return caller

    def _remember(self, key: str, value: Caller | Unauthenticated, ttl: float) -> None:
        self._cache[key] = (self._clock() + ttl, value)
        self._cache.move_to_end(key)
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
