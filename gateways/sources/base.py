"""The seam every run-scoped credential source implements, and what it hands back.

A source issues a credential for a run (``issue``), renews it (``refresh``: a new token, or the
same lease with a later expiry) and takes it back (``revoke``). ``shared`` sources (OAuth2) hold
one credential for every run of the upstream; the others issue one per run. A source raises only
``ValetkeyError``: ``Unavailable(credential_source_unavailable)`` (503) when its backend cannot
be reached, ``UpstreamError(credential_source_refused)`` (502) when it refused; no message ever
carries a credential, a key or a response body.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from contract.claims import AccessClaims
from contract.errors import Reason, Unavailable, UpstreamError
from contract.secret import Secret


@dataclass(frozen=True)
class IssuedCredential:
    """One issued credential. ``id`` and ``username`` are not secret (they go into audit lines);
    ``handle`` is non-secret state the source needs to renew or revoke it (a lease id)."""

    value: Secret
    kind: str
    id: str
    expires_at: float
    username: str = ""
    handle: str = ""

    def remaining(self, now: float | None = None) -> float:
        return self.expires_at - (time.time() if now is None else now)


class RunCredentialSource(Protocol):
    kind: str
    shared: bool

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def issue(self, claims: AccessClaims) -> IssuedCredential: ...

    async def refresh(self, claims: AccessClaims, current: IssuedCredential) -> IssuedCredential: ...

    async def revoke(self, credential: IssuedCredential) -> None: ...


def unavailable(what: str) -> Unavailable:
    return Unavailable(f"{what}: the credential source could not be reached",
                       Reason.CREDENTIAL_SOURCE_UNAVAILABLE)


def refused(what: str, status: int) -> UpstreamError:
    return UpstreamError(f"{what}: the credential source refused ({status})",
                         Reason.CREDENTIAL_SOURCE_REFUSED)


def expiry_id(expires_at: float) -> str:
    """A token's non-secret identifier for audit lines: when it expires."""
    return "expires " + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires_at))
