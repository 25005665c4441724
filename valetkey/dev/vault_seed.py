"""A bootstrapped development Vault: demo secrets and one token per valetkey identity.

Used by the test fixtures and ``valetkey dev``; never point it at a production Vault: it writes
demo values over the upstreams' real secret paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from secrets import token_hex
from types import MappingProxyType
from typing import Any

from contract.errors import BadRequest
from policies.model import PolicySet
from valetkey.bootstrap import (
    ADMIN_POLICY,
    BROKER_POLICY,
    BootstrapReport,
    Layout,
    bootstrap,
    gateway_name,
    open_client,
    vault_errors,
)
from valetkey.proxy_bootstrap import PROXY_POLICY

DEV_IDENTITY_TTL = "24h"


def seed_demo_secrets(client: Any, policies: PolicySet, kind: str = "real") -> dict[str, str]:
    """Write ``<kind>-<upstream>-secret-<random hex>`` at each upstream's KV path; return them.

    ``real`` for the demo upstreams, which accept exactly that value; ``placeholder`` for a user's
    own upstreams in ``valetkey dev``, which will refuse it until the real one is written."""
    seeded: dict[str, str] = {}
    with vault_errors(str(client.url), "write demo secrets"):
        for up in policies.upstreams.values():
            value = f"{kind}-{up.name}-secret-{token_hex(12)}"
            client.secrets.kv.v2.create_or_update_secret(
                path=up.secret.path, mount_point=up.secret.mount, secret={up.secret.field: value}
            )
            seeded[up.name] = value
    return seeded


def _create_token(client: Any, policy: str) -> str:
    with vault_errors(str(client.url), f"create a token with policy {policy}"):
        answer = client.auth.token.create(policies=[policy], ttl=DEV_IDENTITY_TTL)
    return str(answer["auth"]["client_token"])


@dataclass(frozen=True)
class DevVault:
    """A Vault set up by ``bootstrap`` with demo secrets; tokens and secrets never show in repr.

    ``secrets`` maps upstream name to the demo secret written for it.
    """

    addr: str
    policies: PolicySet = field(repr=False)
    report: BootstrapReport = field(repr=False)
    layout: Layout
    root_token: str = field(repr=False)
    broker_token: str = field(repr=False)
    admin_token: str = field(repr=False)
    secrets: Mapping[str, str] = field(repr=False)

    @classmethod
    def create(
        cls, addr: str, root_token: str, policies: PolicySet, layout: Layout | None = None,
        seed_kind: str = "real",
    ) -> DevVault:
        """Bootstrap the Vault at ``addr``, seed demo secrets, mint broker and admin tokens."""
        lay = layout or Layout()
        with open_client(addr, root_token) as client:
            report = bootstrap(client, policies, lay)
            seeded = seed_demo_secrets(client, policies, seed_kind)
            broker = _create_token(client, BROKER_POLICY)
            admin = _create_token(client, ADMIN_POLICY)
        return cls(
            addr=addr, policies=policies, report=report, layout=lay, root_token=root_token,
            broker_token=broker, admin_token=admin, secrets=MappingProxyType(seeded),
        )

    def gateway_token(self, upstream: str) -> str:
        """A fresh token with policy ``valetkey-gateway-<upstream>``."""
        if upstream not in self.policies.upstreams:
            raise BadRequest(f"unknown upstream {upstream!r}; known: {sorted(self.policies.upstreams)}")
        with open_client(self.addr, self.root_token) as client:
            return _create_token(client, gateway_name(upstream))

    def proxy_token(self) -> str:
        """A fresh token with policy ``valetkey-proxy`` (the egress proxy's identity)."""
        with open_client(self.addr, self.root_token) as client:
            return _create_token(client, PROXY_POLICY)

    def runtime_token(self, runtime: str) -> str:
        """A fresh token that identifies ``runtime`` the way its policy says.

        ``vault_policy`` runtimes get a token carrying that policy; ``approle_role`` runtimes log
        in to AppRole with a new secret-id, so the token's metadata carries ``role_name``.
        """
        rt = self.policies.runtimes.get(runtime)
        if rt is None:
            raise BadRequest(f"unknown runtime {runtime!r}; known: {sorted(self.policies.runtimes)}")
        with open_client(self.addr, self.root_token) as client:
            if rt.identity.vault_policy:
                return _create_token(client, rt.identity.vault_policy)
            if not rt.identity.approle_role:
                raise BadRequest(f"runtime {runtime!r} has an entity_id identity; make its token yourself")
            role, mount = rt.identity.approle_role, self.layout.approle_mount
            with vault_errors(self.addr, f"log in to AppRole role {role}"):
                approle = client.auth.approle
                role_id = approle.read_role_id(role_name=role, mount_point=mount)["data"]["role_id"]
                secret_id = approle.generate_secret_id(role_name=role, mount_point=mount)
                answer = approle.login(
                    role_id=role_id, secret_id=secret_id["data"]["secret_id"], use_token=False,
                    mount_point=mount,
                )
            return str(answer["auth"]["client_token"])
