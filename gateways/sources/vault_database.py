"""``kind: vault_database``: one Vault database-engine lease per run.

``issue`` reads ``{mount}/creds/{role}`` for the role of the run's one granted purpose: Vault runs
the role's creation statements, which create a database user (``v-…``) whose group-role
membership is the purpose (read-only, read-write): the database enforces it. ``refresh`` renews
the lease (the engine moves the user's ``VALID UNTIL`` with it), never past the run's expiry;
``revoke`` revokes it, and the role's revocation statements end the user's sessions and drop it.

The lease id is the credential's non-secret ``id`` and ``handle`` (audit lines name it); the
password is the ``value``. With its own narrow identity the gateway may read only these roles'
creds and renew or revoke only their leases (valetkey/bootstrap.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from contract.claims import AccessClaims
from contract.errors import Forbidden, Reason, UpstreamError
from contract.secret import Secret
from contract.vault import VaultClient
from gateways.sources.base import IssuedCredential

KIND = "database_password"
# a lease outlives its run's token by this much: the gateway ends the run's sessions at the
# token's expiry with its own reason (run_expired), then revokes the lease
LEASE_GRACE = 5


def granted_purpose(claims: AccessClaims) -> str:
    """The run's one purpose at this upstream; several are ambiguous (grant the widest one alone)."""
    purposes = {grant.purpose for grant in claims.grants}
    if len(purposes) != 1:
        raise Forbidden(f"the run holds {len(purposes)} purposes for this database; a session uses "
                        "exactly one (grant only the widest it needs)", Reason.PURPOSE_AMBIGUOUS)
    return purposes.pop()


class VaultDatabase:
    kind = KIND
    shared = False

    def __init__(self, vault: VaultClient, mount: str, roles: dict[str, str], *,
                 clock: Callable[[], float] = time.time) -> None:
        self._vault = vault
        self._mount = mount
        self._roles = roles  # purpose -> Vault role
        self._clock = clock

    def __repr__(self) -> str:
        return f"VaultDatabase(mount={self._mount!r}, roles={sorted(self._roles.values())})"

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def role(self, claims: AccessClaims) -> str:
        purpose = granted_purpose(claims)
        role = self._roles.get(purpose)
        if role is None:
            raise Forbidden(f"purpose {purpose} has no database role", Reason.PURPOSE_NOT_GRANTED)
        return role

    async def issue(self, claims: AccessClaims) -> IssuedCredential:
        data, lease_id, seconds = await self._vault.issue_lease(f"{self._mount}/creds/{self.role(claims)}")
        username, password = data.get("username"), data.get("password")
        if not isinstance(username, str) or not isinstance(password, str) or not username or not password:
            await self._vault.revoke_lease(lease_id)
            raise UpstreamError("the database role answered without a user",
                                Reason.CREDENTIAL_SOURCE_REFUSED)
        now = self._clock()
        left = int(claims.exp - now) + LEASE_GRACE
        if left < seconds:  # shorter than Vault gave: the run ends first
            seconds = await self._vault.renew_lease(lease_id, max(1, left))
        return IssuedCredential(value=Secret(password), kind=KIND, id=lease_id,
                                expires_at=now + seconds, username=username, handle=lease_id)

    async def refresh(self, claims: AccessClaims, current: IssuedCredential) -> IssuedCredential:
        """Renew the same lease for what is left of the run (Vault caps it at the role's max_ttl)."""
        now = self._clock()
        left = int(claims.exp - now) + LEASE_GRACE
        if claims.exp <= now:
            return current
        seconds = await self._vault.renew_lease(current.handle, left)
        return IssuedCredential(value=current.value, kind=KIND, id=current.id, expires_at=now + seconds,
                                username=current.username, handle=current.handle)

    async def revoke(self, credential: IssuedCredential) -> None:
        await self._vault.revoke_lease(credential.handle)
