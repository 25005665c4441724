"""End-to-end fixtures for the egress proxy (#15): one stack for the whole directory
(``tests/support/proxy_stack.py``), and what the tests share to judge a client's run.

A missing binary (bao, redis-server, git, curl) or a proxy that does not start fails the tests
with the proxy's own output; nothing is skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import require_binary
from tests.support.proxy_stack import ProxyStack, Sandbox, make_sandbox, proxy_stack
from valetkey.dev.services import RedisServer


@pytest.fixture(scope="session")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyStack]:
    require_binary("git")  # the github.com upstream runs `git http-backend`
    with proxy_stack(redis_server.url, tmp_path_factory.mktemp("proxy-e2e")) as running:
        yield running


def sandbox_for(stack: ProxyStack, tmp_path: Path, *names: str, **extra: str) -> tuple[dict[str, Any], Sandbox]:
    """A fresh run granting ``names`` and the sandbox holding only its bundle."""
    bundle = stack.mint(*names)
    return bundle, make_sandbox(bundle, tmp_path / "sandbox", **extra)


def names_destination(line: dict[str, Any], name: str) -> bool:
    """An audit line is about ``name``: a destination's line or an upstream's (gateway pipeline)."""
    return name in (line.get("destination"), line.get("upstream"))


def every_secret(stack: ProxyStack) -> list[str]:
    return list(stack.vault.secrets.values())
