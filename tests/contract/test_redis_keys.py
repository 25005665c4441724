"""contract/keys.py is the one place a Redis key is named: no other module of the packages spells
one, so a new key (and the hash slot it must share on a Redis Cluster) is decided there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from contract import keys

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("contract", "broker", "gateways", "proxy", "valetkey", "policies")
# a key or channel name: "valetkey:<word>…" or a hash tag "{vk:…}" (messages say "valetkey: …")
KEY_LIKE = re.compile(r"^(valetkey:[A-Za-z0-9_{]|\{vk:)")


def spelled_keys() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "contract" / "keys.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and KEY_LIKE.match(node.value):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:60]!r}")
    return found


def test_no_module_but_keys_names_a_redis_key() -> None:
    assert spelled_keys() == [], "name Redis keys in contract/keys.py"


@pytest.mark.parametrize("group", [
    pytest.param((keys.REVOCATIONS, keys.GENERATION), id="revocations-and-marker"),
    pytest.param((keys.APPROVAL_PREFIX + "apr_1", keys.APPROVALS_PENDING, keys.APPROVALS_RUN_PREFIX + "run_1"),
                 id="approvals"),
    pytest.param(tuple(keys.budget("run_1", "echo") + s for s in (":rate:read", ":requests", ":bytes")),
                 id="budget"),
])
def test_each_atomic_group_shares_one_hash_tag(group: tuple[str, ...]) -> None:
    tags = {name[name.index("{") + 1:name.index("}")] for name in group}
    assert len(tags) == 1
    assert "" not in tags
