"""Session fixtures: a real OpenBao dev server, a real redis-server and a bootstrapped Vault.

A missing binary or a service that does not come up raises ``ServiceError``: it fails the
tests that need it, it never skips them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from policies.load import load_policy_dir
from policies.model import PolicySet
from valetkey.dev.services import OpenBaoDev, RedisServer
from valetkey.dev.vault_seed import DevVault

# the broker and gateway stacks are fixtures every test package may use
pytest_plugins = ["tests.support.broker_stack", "tests.support.gateway_stack", "tests.support.pg_stack"]

REPO = Path(__file__).resolve().parent.parent
SHIPPED_POLICY_DIR = REPO / "policies"


@pytest.fixture(scope="session")
def vault() -> Iterator[OpenBaoDev]:
    """An OpenBao dev server: ``.addr``, ``.root_token``."""
    with OpenBaoDev() as server:
        yield server


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A redis-server: ``.port``, ``.url``; ``stop()``/``start()`` keep the port."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def shipped_policies() -> PolicySet:
    return load_policy_dir(SHIPPED_POLICY_DIR)


@pytest.fixture(scope="session")
def bootstrapped_vault(vault: OpenBaoDev, shipped_policies: PolicySet) -> DevVault:
    """``vault`` after ``valetkey vault bootstrap`` with the shipped policies and demo secrets.

    ``.addr``, ``.root_token``, ``.broker_token``, ``.admin_token``, ``.secrets`` (upstream →
    seeded value), ``.report``, ``.gateway_token(upstream)``, ``.runtime_token(runtime)``.
    """
    return DevVault.create(vault.addr, vault.root_token, shipped_policies)
