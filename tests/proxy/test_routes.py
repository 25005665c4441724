"""Hosts outside the policy: which a runtime may ask about, which the enterprise closes, and what
the proxy's route makes of a (runtime, host, port). No I/O."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.errors import Forbidden
from policies.hosts import HostPattern
from policies.load import load_policy_dir
from policies.model import UNLISTED_PURPOSE, PolicySet
from proxy.routes import UNLISTED, route, unlisted
from tests.policies.test_destinations import UPSTREAM

POLICY = UPSTREAM + """---
version: 1
kind: destination
name: docs
why: Read docs.
host: docs.partner.example
tls: tunnel
---
version: 1
kind: runtime
name: asker
identity: {vault_policy: asker}
allow: {api: [read]}
unlisted_hosts:
  ask: ["*.partner.example", status.example.org]
  ports: [443, 80]
  approvers: vendors
  timeout: 2m
  max_body: 4KiB
---
version: 1
kind: runtime
name: plain
identity: {vault_policy: plain}
allow: {api: [read]}
---
version: 1
kind: enterprise
approvers: {vendors: {vault_policy: vendor-approvers}}
deny:
  - {host: files.partner.example, why: Uploads leave the company.}
"""


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> PolicySet:
    directory: Path = tmp_path_factory.mktemp("unlisted")
    (directory / "policy.yaml").write_text(POLICY)
    return load_policy_dir(directory)


def test_the_runtime_document_loads_into_its_asking_rules(policies: PolicySet) -> None:
    asks = policies.runtimes["asker"].unlisted
    assert asks is not None
    assert ([str(h) for h in asks.ask], sorted(asks.ports), asks.approvers, asks.timeout, asks.max_body) == (
        ["*.partner.example", "status.example.org"], [80, 443], "vendors", 120, 4096)
    purpose = asks.purpose
    assert purpose.name == UNLISTED_PURPOSE
    assert purpose.approval is not None
    assert (purpose.approval.approvers, purpose.approval.timeout, purpose.limits.max_body) == ("vendors", 120, 4096)
    assert policies.runtimes["plain"].unlisted is None


ROUTES = [
    # (runtime, host, port, expected: "unlisted" | a destination name | a refusal's reason)
    pytest.param("asker", "status.example.org", 443, "unlisted", id="exact-name"),
    pytest.param("asker", "a.b.partner.example", 80, "unlisted", id="wildcard-plain-http"),
    pytest.param("asker", "docs.partner.example", 443, "docs", id="a-destination-wins"),
    pytest.param("asker", "partner.example", 443, "destination_not_allowed", id="wildcard-not-the-apex"),
    pytest.param("asker", "status.example.org", 8443, "destination_not_allowed", id="port-not-asked"),
    pytest.param("asker", "other.example.org", 443, "destination_not_allowed", id="host-not-asked"),
    pytest.param("plain", "status.example.org", 443, "destination_not_allowed", id="runtime-may-not-ask"),
    pytest.param("nobody", "status.example.org", 443, "destination_not_allowed", id="unknown-runtime"),
    pytest.param("asker", "api.example.com", 80, "destination_port_not_allowed", id="named-host-other-port"),
]


def decide(policies: PolicySet, runtime: str, host: str, port: int) -> str:
    """What the CONNECT's route step makes of it: a destination's name, "unlisted", or the refusal."""
    try:
        found = route(policies, host, port)
    except Forbidden as exc:
        try:
            found = unlisted(policies, runtime, host, port, exc)
        except Forbidden as refusal:
            return refusal.code
    return "unlisted" if found.name == UNLISTED else found.name


@pytest.mark.parametrize(("runtime", "host", "port", "expected"), ROUTES)
def test_route_or_ask(policies: PolicySet, runtime: str, host: str, port: int, expected: str) -> None:
    assert decide(policies, runtime, host, port) == expected


@pytest.mark.parametrize(("host", "denied"), [
    pytest.param("files.partner.example", True, id="named"),
    pytest.param("x.files.partner.example", False, id="below-an-exact-rule"),
    pytest.param("status.example.org", False, id="other"),
])
def test_the_enterprise_closes_hosts(policies: PolicySet, host: str, denied: bool) -> None:
    assert (policies.enterprise.denied_host(host) is not None) is denied


@pytest.mark.parametrize(("outer", "inner", "covers"), [
    pytest.param("*.example.com", "a.example.com", True, id="wildcard-covers-name"),
    pytest.param("*.example.com", "*.a.example.com", True, id="wildcard-covers-deeper-wildcard"),
    pytest.param("*.example.com", "*.example.com", True, id="same-wildcard"),
    pytest.param("*.a.example.com", "*.example.com", False, id="narrower-does-not-cover-broader"),
    pytest.param("a.example.com", "*.a.example.com", False, id="name-does-not-cover-wildcard"),
    pytest.param("*.example.com", "example.com", False, id="wildcard-not-the-apex"),
    pytest.param("*.example.com", "badexample.com", False, id="suffix-on-a-label-boundary"),
])
def test_covers(outer: str, inner: str, covers: bool) -> None:
    assert HostPattern.parse(outer).covers(HostPattern.parse(inner)) is covers
