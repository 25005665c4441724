"""Destinations: host forms, what a valid document loads into, and which entry covers a host:port."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.destinations import Miss
from policies.hosts import HostError, HostPattern, canonical_host, is_ip_literal
from policies.load import load_policy_dir
from policies.model import CONNECT_PURPOSE, PolicySet, TlsMode

UPSTREAM = """version: 1
kind: upstream
name: api
base_url: https://api.example.com
secret: {path: fixtures/api, field: token}
inject: {header: Authorization, format: "Bearer {secret}"}
env: {placeholder: API_TOKEN, base_url: API_URL}
purposes:
  read: {why: Read., methods: [GET], paths: [/v1/**]}
"""


def dest(name: str, host: str, tls: str = "tunnel", extra: str = "") -> str:
    return (f"---\nversion: 1\nkind: destination\nname: {name}\nwhy: Reach {name}.\n"
            f"host: '{host}'\ntls: {tls}\n{extra}")


TERMINATE = "purposes:\n  read: {why: Read., methods: [GET, HEAD], paths: ['/docs/**', '/simple/{pkg}/']}\n"
POLICY = UPSTREAM + "".join([
    dest("pypi", "pypi.org"),
    dest("docs", "docs.example.com", "terminate", "ports: [443, 80]\n" + TERMINATE),
    dest("any-example", "*.example.com", extra="ports: [443, 8443]\n"),
    dest("deep-example", "*.cdn.example.com"),
    dest("internal", "registry", "terminate", "allow_private: true\nports: [5000]\n" + TERMINATE),
])


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> PolicySet:
    root = tmp_path_factory.mktemp("dest-policy")
    (root / "all.yaml").write_text(POLICY)
    return load_policy_dir(root)


@pytest.mark.parametrize(
    ("host", "port", "target", "miss"),
    [
        pytest.param("pypi.org", 443, "pypi", None, id="exact"),
        pytest.param("PyPI.ORG", 443, "pypi", None, id="exact-any-case"),
        pytest.param("pypi.org", 80, None, Miss.PORT_NOT_ALLOWED, id="exact-other-port"),
        pytest.param("pypi.org.", 443, None, Miss.NOT_ALLOWED, id="trailing-dot"),
        pytest.param("www.pypi.org", 443, None, Miss.NOT_ALLOWED, id="exact-is-no-wildcard"),
        pytest.param("xpypi.org", 443, None, Miss.NOT_ALLOWED, id="exact-is-no-suffix"),
        pytest.param("api.example.com", 443, "api", None, id="upstream-is-a-destination"),
        pytest.param("api.example.com", 8443, None, Miss.PORT_NOT_ALLOWED,
                     id="upstream-owns-its-host-wildcard-port-not-borrowed"),
        pytest.param("docs.example.com", 80, "docs", None, id="exact-beats-wildcard-plain-http"),
        pytest.param("docs.example.com", 8443, None, Miss.PORT_NOT_ALLOWED,
                     id="exact-owns-host-against-wildcard"),
        pytest.param("a.example.com", 443, "any-example", None, id="wildcard-one-label"),
        pytest.param("a.b.example.com", 8443, "any-example", None, id="wildcard-two-labels"),
        pytest.param("example.com", 443, None, Miss.NOT_ALLOWED, id="wildcard-never-the-apex"),
        pytest.param("badexample.com", 443, None, Miss.NOT_ALLOWED, id="wildcard-label-boundary"),
        pytest.param("a.example.com.evil.net", 443, None, Miss.NOT_ALLOWED, id="wildcard-suffix-only"),
        pytest.param("a.example.com", 80, None, Miss.PORT_NOT_ALLOWED, id="wildcard-other-port"),
        pytest.param("x.cdn.example.com", 443, "deep-example", None, id="longest-wildcard-wins"),
        pytest.param("x.cdn.example.com", 8443, None, Miss.PORT_NOT_ALLOWED,
                     id="longest-wildcard-owns-its-ports"),
        pytest.param("cdn.example.com", 443, "any-example", None, id="apex-of-deeper-wildcard"),
        pytest.param("registry", 5000, "internal", None, id="single-label-name"),
        pytest.param("127.0.0.1", 443, None, Miss.IP_LITERAL, id="ipv4"),
        pytest.param("[::1]", 443, None, Miss.IP_LITERAL, id="ipv6-bracketed"),
        pytest.param("::1", 443, None, Miss.IP_LITERAL, id="ipv6"),
        pytest.param("2130706433", 443, None, Miss.IP_LITERAL, id="decimal-ipv4"),
        pytest.param("0x7f.1", 443, None, Miss.IP_LITERAL, id="hex-ipv4"),
        pytest.param("1.example.com.0x10", 443, None, Miss.IP_LITERAL, id="numeric-last-label"),
        pytest.param("", 443, None, Miss.NOT_ALLOWED, id="empty"),
        pytest.param("a..example.com", 443, None, Miss.NOT_ALLOWED, id="empty-label"),
        pytest.param("a b.example.com", 443, None, Miss.NOT_ALLOWED, id="space"),
        pytest.param("ex\u00e4mple.example.com", 443, None, Miss.NOT_ALLOWED, id="non-ascii"),
        pytest.param("pypi.org:443", 443, None, Miss.NOT_ALLOWED, id="port-in-host"),
        pytest.param("nosuch.net", 443, None, Miss.NOT_ALLOWED, id="unknown"),
    ],
)
def test_route(policy: PolicySet, host: str, port: int, target: str | None, miss: Miss | None) -> None:
    route = policy.route(host, port)

    assert (getattr(route.target, "name", None), route.miss) == (target, miss)
    assert policy.destination_for(host, port) is route.target


def test_miss_values_are_the_reason_codes_of_proxy_spec() -> None:
    assert {m.value for m in Miss} == {
        "destination_ip_literal", "destination_not_allowed", "destination_port_not_allowed"}


def test_valid_destinations_load(policy: PolicySet) -> None:
    pypi, docs = policy.destinations["pypi"], policy.destinations["docs"]

    assert (pypi.tls, pypi.ports, sorted(pypi.purposes)) == (TlsMode.TUNNEL, {443}, [CONNECT_PURPOSE])
    connect = pypi.purposes[CONNECT_PURPOSE]
    assert (connect.methods, connect.paths, connect.params) == (frozenset(), (), ())
    assert (docs.tls, docs.ports, docs.host.raw) == (TlsMode.TERMINATE, {80, 443}, "docs.example.com")
    assert [str(t) for t in docs.purposes["read"].paths] == ["/docs/**", "/simple/{pkg}/"]
    assert policy.destinations["internal"].allow_private
    assert policy.target("api") is policy.upstreams["api"]
    assert policy.target("pypi") is pypi
    assert policy.target("nosuch") is None


def test_ca_file_is_resolved_from_the_policy_file(tmp_path: Path) -> None:
    from tests.support.certs import make_ca

    make_ca(tmp_path)[0].rename(tmp_path / "ca.pem")
    (tmp_path / "d.yaml").write_text(dest("docs", "docs.example.com", "terminate",
                                          "ca_file: ca.pem\n" + TERMINATE))

    assert load_policy_dir(tmp_path).destinations["docs"].ca_file == str(tmp_path / "ca.pem")


@pytest.mark.parametrize(
    ("raw", "suffix", "wildcard"),
    [
        pytest.param("pypi.org", "pypi.org", False, id="exact"),
        pytest.param("*.example.com", "example.com", True, id="wildcard"),
        pytest.param("my_service", "my_service", False, id="single-label-underscore"),
        pytest.param("xn--bcher-kva.example", "xn--bcher-kva.example", False, id="punycode"),
    ],
)
def test_host_pattern_parses(raw: str, suffix: str, wildcard: bool) -> None:
    pattern = HostPattern.parse(raw)

    assert (pattern.suffix, pattern.wildcard, str(pattern)) == (suffix, wildcard, raw)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param("10.0.0.1", "IP literal", id="ipv4"),
        pytest.param("::1", "IP literal", id="ipv6"),
        pytest.param("*.10.0.0.1", "IP literal", id="wildcard-over-ip"),
        pytest.param("0x7f.1", "IP literal", id="hex"),
        pytest.param("*", "'*' other than a leading", id="star-alone"),
        pytest.param("*.", "ends with a dot", id="star-dot"),
        pytest.param("**.example.com", "'*' other than a leading", id="double-star"),
        pytest.param("*example.com", "'*' other than a leading", id="star-glued"),
        pytest.param("*.*.example.com", "'*' other than a leading", id="two-wildcards"),
        pytest.param("b\u00fccher.example", "not ASCII", id="idn"),
        pytest.param("-a.example.com", "not a DNS name", id="leading-dash"),
        pytest.param("a" * 64 + ".com", "not a DNS name", id="label-too-long"),
        pytest.param("example.com:443", "not a DNS name", id="port"),
        pytest.param("a/b.example.com", "not a DNS name", id="slash"),
    ],
)
def test_host_pattern_refuses(raw: str, message: str) -> None:
    with pytest.raises(HostError) as info:
        HostPattern.parse(raw)

    assert message in info.value.message
    assert info.value.fix


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        pytest.param("PyPI.org", "pypi.org", id="lowered"),
        pytest.param("pypi.org.", None, id="trailing-dot"),
        pytest.param("127.0.0.1", None, id="ip"),
        pytest.param("", None, id="empty"),
    ],
)
def test_canonical_host(host: str, expected: str | None) -> None:
    assert canonical_host(host) == expected


def test_ip_literal_forms() -> None:
    assert all(is_ip_literal(h) for h in ("1.2.3.4", "[::1]", "::ffff:1.2.3.4", "017700000001", "1.0x2"))
    assert not any(is_ip_literal(h) for h in ("pypi.org", "1.example.com", "a1"))


def test_shipped_destinations_load_and_the_coding_agent_grants_them() -> None:
    from policies.load import SHIPPED_POLICY_DIR

    policy = load_policy_dir(SHIPPED_POLICY_DIR)
    agent = policy.runtimes["coding-agent"]

    assert {"pypi", "pythonhosted", "python-docs", "github-codeload"} <= set(policy.destinations)
    assert agent.may_grant("pypi", CONNECT_PURPOSE)
    assert policy.route("files.pythonhosted.org", 443).target is policy.destinations["pythonhosted"]
    assert policy.route("github.com", 443).target is policy.upstreams["github-git"]
