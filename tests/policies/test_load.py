"""Loading policy directories: good sets load; each broken fixture fails on exactly its problem.

Every directory under ``tests/fixtures/policies/broken`` holds the offending document in
``broken.yaml`` (plus, where the problem needs company, a valid ``base.yaml``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from policies.load import PolicyLoadError, Problem, load_policy_dir
from policies.model import (
    Approval,
    Identity,
    Injection,
    Limits,
    Placement,
    PolicySet,
    Purpose,
    Rate,
    Runtime,
    SandboxEnv,
    SecretRef,
    Upstream,
)
from policies.templates import PathTemplate

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "policies"
FIXTURES = REPO / "tests" / "fixtures" / "policies"
BROKEN = FIXTURES / "broken"
ASKS = "runtime demo-agent unlisted_hosts"
VALID = FIXTURES / "valid"

PURPOSE = "upstream demo purpose read_item"

BROKEN_CASES = [
    pytest.param("unknown-top-level-key", "upstream demo", "unknown key 'colour'",
                 id="unknown-top-level-key"),
    pytest.param("unknown-purpose-key", PURPOSE, "unknown key 'timeout'", id="unknown-purpose-key"),
    pytest.param("missing-version", "document 1 version", "missing key 'version'",
                 id="missing-version"),
    pytest.param("wrong-version", "document 1 version", "version is 2", id="wrong-version"),
    pytest.param("version-boolean", "document 1 version", "version is True", id="version-boolean"),
    pytest.param("unknown-kind", "document 1 kind", "kind is 'gateway'", id="unknown-kind"),
    pytest.param("base-url-ftp", "upstream demo base_url", "scheme 'ftp' is not http or https",
                 id="base-url-ftp"),
    pytest.param("base-url-userinfo", "upstream demo base_url", "userinfo", id="base-url-userinfo"),
    pytest.param("base-url-fragment", "upstream demo base_url", "fragment", id="base-url-fragment"),
    pytest.param("base-url-path", "upstream demo base_url", "path '/v1'", id="base-url-path"),
    pytest.param("base-url-query", "upstream demo base_url", "query", id="base-url-query"),
    pytest.param("base-url-port-zero", "upstream demo base_url", "port 0", id="base-url-port-zero"),
    pytest.param("base-url-backslash-host", "upstream demo base_url", "exactly one host",
                 id="base-url-backslash-host"),
    pytest.param("base-url-numeric-host", "upstream demo base_url", "exactly one host",
                 id="base-url-numeric-host"),
    pytest.param("secret-path-dotdot", "upstream demo secret", "'.' or '..' segment",
                 id="secret-path-dotdot"),
    pytest.param("path-template-catch-all", f"{PURPOSE} paths[0]", "'/{path}' matches every path",
                 id="path-template-catch-all"),
    pytest.param("path-template-two-params", f"{PURPOSE} paths[0]",
                 "'/{a}/{b}' matches every path", id="path-template-two-params"),
    pytest.param("path-template-star", f"{PURPOSE} paths[0]", "wildcard", id="path-template-star"),
    pytest.param("path-template-dotdot", f"{PURPOSE} paths[0]", "'.' or '..' segment",
                 id="path-template-dotdot"),
    pytest.param("purpose-without-why", PURPOSE, "missing key 'why'", id="purpose-without-why"),
    pytest.param("why-multiline", f"{PURPOSE} why", "one-line", id="why-multiline"),
    pytest.param("duplicate-upstream-name", "upstream demo", "duplicate upstream name",
                 id="duplicate-upstream-name"),
    pytest.param("duplicate-yaml-key", "yaml", "line 4, column 1: duplicate key 'name'",
                 id="duplicate-yaml-key"),
    pytest.param("unhashable-yaml-key", "yaml", "unhashable key", id="unhashable-yaml-key"),
    pytest.param("huge-integer", "yaml", "digits", id="huge-integer"),
    pytest.param("invalid-yaml", "yaml", "while parsing a flow sequence", id="invalid-yaml"),
    pytest.param("runtime-unknown-upstream", "runtime demo-agent allow",
                 "unknown upstream 'nosuch'", id="runtime-unknown-upstream"),
    pytest.param("runtime-unknown-purpose", "runtime demo-agent allow demo",
                 "unknown purpose 'write_item'", id="runtime-unknown-purpose"),
    pytest.param("runtime-without-identity", "runtime demo-agent", "missing key 'identity'",
                 id="runtime-without-identity"),
    pytest.param("runtime-two-identities", "runtime demo-agent identity", "exactly one of",
                 id="runtime-two-identities"),
    pytest.param("runtime-duplicate-identity", "runtime copycat identity",
                 "same Vault identity as runtime demo-agent", id="runtime-duplicate-identity"),
    pytest.param("method-trace", f"{PURPOSE} methods", "unsupported methods ['TRACE']",
                 id="method-trace"),
    pytest.param("params-unknown", f"{PURPOSE} params", "'owner' appears in no path template",
                 id="params-unknown"),
    pytest.param("rate-bad", f"{PURPOSE} limits rate", "expected a rate", id="rate-bad"),
    pytest.param("max-body-bad", f"{PURPOSE} limits max_body", "expected a size",
                 id="max-body-bad"),
    pytest.param("run-limits-concurrent-zero", "upstream demo run_limits concurrent",
                 "0 is not a whole number from 1 to 100000", id="run-limits-concurrent-zero"),
    pytest.param("inject-no-placement", "upstream demo inject", "no placement",
                 id="inject-no-placement"),
    pytest.param("header-format-without-secret", "upstream demo inject format",
                 "must contain {secret} exactly once", id="header-format-without-secret"),
    pytest.param("header-format-crlf", "upstream demo inject format", "non-printable",
                 id="header-format-crlf"),
    pytest.param("inject-host-header", "upstream demo inject header", "framing, routing",
                 id="inject-host-header"),
    pytest.param("env-reserved-proxy", "upstream demo env", "HTTPS_PROXY is a variable",
                 id="env-reserved-proxy"),
    pytest.param("max-ttl-over-ceiling", "runtime demo-agent max_ttl", "over the 86400s ceiling",
                 id="max-ttl-over-ceiling"),
    pytest.param("env-var-collision", "upstream other env", "variable DEMO_TOKEN also used by demo",
                 id="env-var-collision"),
    pytest.param("max-ttl-negative", "runtime demo-agent max_ttl", "must be positive",
                 id="max-ttl-negative"),
    pytest.param("max-ttl-garbage", "runtime demo-agent max_ttl", "expected a duration",
                 id="max-ttl-garbage"),
    pytest.param("allow-fields-not-credential", f"{PURPOSE} allow_fields",
                 "'max_tokens' is not a credential-named field", id="allow-fields-not-credential"),
    pytest.param("allow-fields-not-list", f"{PURPOSE} allow_fields", "expected a list of field names",
                 id="allow-fields-not-list"),
    pytest.param('destination-ip-literal', 'destination pkgs host', "'10.0.0.1' is an IP literal",
                 id='destination-ip-literal'),
    pytest.param('destination-ipv6-literal', 'destination pkgs host', "'[::1]' is an IP literal",
                 id='destination-ipv6-literal'),
    pytest.param('destination-numeric-host', 'destination pkgs host', "'2130706433' is an IP literal",
                 id='destination-numeric-host'),
    pytest.param('destination-upper-case', 'destination pkgs host', 'is not lower case',
                 id='destination-upper-case'),
    pytest.param('destination-trailing-dot', 'destination pkgs host', 'ends with a dot',
                 id='destination-trailing-dot'),
    pytest.param('destination-wildcard-middle', 'destination pkgs host', "'*' other than a leading '*.'",
                 id='destination-wildcard-middle'),
    pytest.param('destination-wildcard-tld', 'destination pkgs host', 'covers a whole top-level domain',
                 id='destination-wildcard-tld'),
    pytest.param('destination-bad-host', 'destination pkgs host', 'is not a DNS name',
                 id='destination-bad-host'),
    pytest.param('destination-tls-bad', 'destination pkgs tls', "'passthrough' is not tunnel or terminate",
                 id='destination-tls-bad'),
    pytest.param('destination-tunnel-purposes', 'destination pkgs purposes', 'a tunnel destination has no purposes',
                 id='destination-tunnel-purposes'),
    pytest.param('destination-terminate-no-purposes', 'destination pkgs', "missing key 'purposes'",
                 id='destination-terminate-no-purposes'),
    pytest.param('destination-tunnel-port-80', 'destination pkgs ports', 'port 80 is plain HTTP',
                 id='destination-tunnel-port-80'),
    pytest.param('destination-port-zero', 'destination pkgs ports', '0 is not a port number 1..65535',
                 id='destination-port-zero'),
    pytest.param('destination-port-twice', 'destination pkgs ports', 'a port is named twice',
                 id='destination-port-twice'),
    pytest.param('destination-ca-file-tunnel', 'destination pkgs ca_file', 'verified by the client',
                 id='destination-ca-file-tunnel'),
    pytest.param('destination-ca-file-missing', 'destination pkgs ca_file', 'nosuch.pem: FileNotFoundError',
                 id='destination-ca-file-missing'),
    pytest.param('destination-purpose-connect', 'destination pkgs purpose connect', 'implicit purpose of tunnel destinations',
                 id='destination-purpose-connect'),
    pytest.param('destination-path-tail-middle', 'destination pkgs purpose read paths[0]', "'/docs/**/x' contains a wildcard",
                 id='destination-path-tail-middle'),
    pytest.param('destination-without-why', 'destination pkgs', "missing key 'why'",
                 id='destination-without-why'),
    pytest.param('destination-unknown-key', 'destination pkgs', "unknown key 'port'",
                 id='destination-unknown-key'),
    pytest.param('destination-duplicate-name', 'destination pkgs', 'duplicate destination name',
                 id='destination-duplicate-name'),
    pytest.param('destination-wildcard-clash', 'destination again host', '*.example.com:443 is also destination pkgs',
                 id='destination-wildcard-clash'),
    pytest.param('destination-name-clash-upstream', 'destination demo', 'name also used by upstream demo',
                 id='destination-name-clash-upstream'),
    pytest.param('destination-host-clash-upstream', 'destination pkgs host', 'api.example.com:443 is also upstream demo',
                 id='destination-host-clash-upstream'),
    pytest.param('runtime-unknown-destination-purpose', 'runtime demo-agent allow pkgs', "unknown purpose 'install'",
                 id='runtime-unknown-destination-purpose'),
    # approvals and the enterprise document (docs/policy.md#approval)
    pytest.param("approval-bad-value", f"{PURPOSE} approval", "'yes-please' is not a valid approval",
                 id="approval-bad-value"),
    pytest.param("approval-timeout-too-long", f"{PURPOSE} approval_timeout", "7200s is not 1s..3600s",
                 id="approval-timeout-too-long"),
    pytest.param("approvers-without-approval", PURPOSE, "without `approval: required`",
                 id="approvers-without-approval"),
    pytest.param("approval-unknown-group", f"{PURPOSE} approvers", "unknown approver group 'nobody'",
                 id="approval-unknown-group"),
    pytest.param("deny-granted-purpose", "runtime demo-agent allow demo",
                 "purpose 'read_item' is denied by the enterprise", id="deny-granted-purpose"),
    pytest.param("deny-unknown-upstream", "enterprise deny[0] upstream", "unknown upstream 'nosuch'",
                 id="deny-unknown-upstream"),
    pytest.param("deny-purpose-and-paths", "enterprise deny[0]", "both a purpose and methods/paths",
                 id="deny-purpose-and-paths"),
    pytest.param("enterprise-two-documents", "enterprise", "a second enterprise document",
                 id="enterprise-two-documents"),
    # hosts outside the policy, asked about per request (docs/policy.md#unlisted-hosts)
    pytest.param("unlisted-hosts-no-ask", f"{ASKS}", "missing key 'ask'", id="unlisted-hosts-no-ask"),
    pytest.param("unlisted-hosts-ip-literal", f"{ASKS} ask[0]", "is an IP literal", id="unlisted-hosts-ip-literal"),
    pytest.param("unlisted-hosts-timeout-too-long", f"{ASKS} timeout", "7200s is not 1s..3600s",
                 id="unlisted-hosts-timeout-too-long"),
    pytest.param("unlisted-hosts-body-too-large", f"{ASKS} max_body", "is over 1048576",
                 id="unlisted-hosts-body-too-large"),
    pytest.param("unlisted-hosts-named-by-upstream", f"{ASKS} ask", "api.example.com is named by upstream demo",
                 id="unlisted-hosts-named-by-upstream"),
    pytest.param("unlisted-hosts-denied", f"{ASKS} ask", "paste.example.org is denied by the enterprise",
                 id="unlisted-hosts-denied"),
    pytest.param("unlisted-hosts-unknown-group", f"{ASKS} approvers", "unknown approver group 'nobody'",
                 id="unlisted-hosts-unknown-group"),
    pytest.param("deny-host-and-upstream", "enterprise deny[0]", "needs exactly one of upstream and host",
                 id="deny-host-and-upstream"),
    pytest.param("deny-host-with-paths", "enterprise deny[0]", "a host rule denies the whole host",
                 id="deny-host-with-paths"),
    pytest.param("deny-host-named-by-upstream", "upstream demo", "api.example.com is denied by the enterprise",
                 id="deny-host-named-by-upstream"),
]


def load_problems(directory: Path) -> list[Problem]:
    with pytest.raises(PolicyLoadError) as info:
        load_policy_dir(directory)
    return info.value.problems


@pytest.mark.parametrize(("dirname", "rule", "message"), BROKEN_CASES)
def test_broken_fixture_fails_on_exactly_its_problem(dirname: str, rule: str, message: str) -> None:
    problems = load_problems(BROKEN / dirname)

    assert len(problems) == 1, problems
    problem = problems[0]
    assert Path(problem.file).parts[-2:] == (dirname, "broken.yaml")
    assert rule in problem.rule
    assert message in problem.message
    assert problem.fix.strip()


def test_every_broken_fixture_is_in_the_table() -> None:
    on_disk = {p.name for p in BROKEN.iterdir() if p.is_dir()}
    in_table = {case.values[0] for case in BROKEN_CASES}
    assert on_disk == in_table


def test_every_problem_has_a_rule_a_message_and_a_fix() -> None:
    problems = [p for d in sorted(BROKEN.iterdir()) for p in load_problems(d)]

    assert problems
    for problem in problems:
        assert problem.file, problem
        assert problem.rule.strip(), problem
        assert problem.message.strip(), problem
        assert problem.fix.strip(), problem


def test_error_message_lists_file_rule_message_and_fix() -> None:
    with pytest.raises(PolicyLoadError) as info:
        load_policy_dir(BROKEN / "base-url-ftp")

    file = str(BROKEN / "base-url-ftp" / "broken.yaml")
    assert str(info.value) == (
        f"{file}: upstream demo base_url: scheme 'ftp' is not http or https "
        "(fix: write an origin such as https://api.example.com (path prefixes go in env.base_path))"
    )


def test_problems_from_several_files_are_reported_together(tmp_path: Path) -> None:
    for dirname in ("base-url-ftp", "max-ttl-garbage"):
        text = (BROKEN / dirname / "broken.yaml").read_text()
        (tmp_path / f"{dirname}.yaml").write_text(text)

    problems = load_problems(tmp_path)

    assert [(Path(p.file).name, p.rule) for p in problems] == [
        ("base-url-ftp.yaml", "upstream demo base_url"),
        ("max-ttl-garbage.yaml", "runtime demo-agent max_ttl"),
    ]


def test_cross_references_wait_for_clean_documents(tmp_path: Path) -> None:
    """An unknown upstream is not reported while the documents themselves have problems."""
    for dirname in ("runtime-unknown-upstream", "base-url-query"):
        (tmp_path / dirname).mkdir()
        (tmp_path / dirname / "broken.yaml").write_text(
            (BROKEN / dirname / "broken.yaml").read_text()
        )

    problems = load_problems(tmp_path)

    assert [p.rule for p in problems] == ["upstream demo base_url"]


@pytest.mark.parametrize(
    ("text", "rule", "message"),
    [
        pytest.param("- version: 1\n", "document 1", "is not a mapping", id="list-document"),
        pytest.param("just text\n", "document 1", "is not a mapping", id="scalar-document"),
        pytest.param(
            "version: 1\nkind: runtime\nname: a\nidentity: {vault_policy: a}\nallow: {}\n"
            "---\nversion: 1\n",
            "document 2 kind", "kind is None", id="second-document-without-kind",
        ),
        pytest.param("a: " + "[" * 5000 + "]" * 5000 + "\n", "yaml", "nested too deeply",
                     id="deeply-nested"),
        pytest.param("a: !!python/object:os.system {}\n", "yaml",
                     "could not determine a constructor", id="python-tag"),
        pytest.param("b: &x {c: 1}\nd:\n  <<: *x\n", "yaml", "merge", id="merge-key"),
    ],
)
def test_malformed_documents(tmp_path: Path, text: str, rule: str, message: str) -> None:
    (tmp_path / "doc.yaml").write_text(text)

    problems = load_problems(tmp_path)

    assert len(problems) == 1, problems
    assert (problems[0].rule, Path(problems[0].file).name) == (rule, "doc.yaml")
    assert message in problems[0].message


def test_not_a_directory(tmp_path: Path) -> None:
    problems = load_problems(tmp_path / "missing")

    assert [(p.rule, p.message) for p in problems] == [("policy dir", "is not a directory")]


def test_undecodable_file(tmp_path: Path) -> None:
    (tmp_path / "latin1.yml").write_bytes(b"name: caf\xe9\n")

    problems = load_problems(tmp_path)

    assert [(Path(p.file).name, p.rule) for p in problems] == [("latin1.yml", "file")]


def test_only_yaml_files_are_read(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("not: [policy")
    (tmp_path / "notes.txt").write_text("version: 2\n")

    assert load_policy_dir(tmp_path) == PolicySet()


def test_shipped_policies_load() -> None:
    policy = load_policy_dir(SHIPPED)

    assert sorted(policy.upstreams) == ["anthropic", "github", "github-git", "openai", "slack"]
    assert sorted(policy.runtimes) == ["coding-agent", "notifier"]
    github = policy.upstreams["github"]
    assert github.injection == Injection(Placement.HEADER, header="Authorization",
                                         format="Bearer {secret}")
    assert github.purposes["comment_issue"].params == ("owner", "repo", "number")
    assert github.purposes["comment_issue"].limits == Limits(max_body=65536, rate=Rate(10, 600))
    assert policy.upstreams["github-git"].injection.placement is Placement.BASIC
    assert policy.upstreams["openai"].env.base_path == "/v1"
    assert policy.runtimes["notifier"].max_ttl == 1800
    assert policy.runtimes["coding-agent"].identity == Identity(
        approle_role="valetkey-runtime-coding-agent"
    )
    irreversible = {(u, p) for u, up in policy.upstreams.items() for p, purpose in up.purposes.items()
                    if purpose.approval is not None}
    assert irreversible == {("github", "merge_pull_request"), ("github", "create_release"),
                            ("github", "delete_repo"), ("slack", "post_message")}
    assert github.purposes["create_release"].approval == Approval(approvers="releases", timeout=1800)
    assert set(policy.enterprise.approvers) == {"releases"}
    assert policy.enterprise.denied("github", "", "POST", ("repos", "acme", "w", "transfer")) is not None
    assert policy.enterprise.denied("github", "", "GET", ("repos", "acme", "w", "transfer")) is None
    for up in policy.upstreams.values():
        assert Path(up.source).parent == SHIPPED / "upstreams"
        assert (up.scheme, up.port, up.allow_private) == ("https", 443, False)


def test_shipped_runtimes_grant_only_declared_purposes() -> None:
    policy = load_policy_dir(SHIPPED)

    for rt in policy.runtimes.values():
        for upstream, purposes in rt.allow.items():
            target = policy.target(upstream)
            assert target is not None, (rt.name, upstream)
            assert purposes <= set(target.purposes), (rt.name, upstream)


def _path(raw: str) -> PathTemplate:
    return PathTemplate.parse(raw)


EXPECTED_GIT_HOST = Upstream(
    name="git-host",
    base_url="https://git.example.com",
    scheme="https",
    host="git.example.com",
    port=443,
    secret=SecretRef(mount="secret", path="fixtures/git-host", field="token"),
    injection=Injection(Placement.BASIC, username="x-access-token"),
    env=SandboxEnv(placeholder="GIT_HOST_PASSWORD", base_url="GIT_HOST_URL"),
    purposes={
        "clone": Purpose(
            name="clone",
            why="Fetch one repository over git smart-HTTP.",
            methods=frozenset({"GET", "POST"}),
            paths=(_path("/{owner}/{repo}/info/refs"), _path("/{owner}/{repo}/git-upload-pack")),
            params=("owner", "repo"),
            limits=Limits(max_body=1024 * 1024, rate=Rate(count=10, period=60)),
        )
    },
    allow_private=False,
    source=str(VALID / "upstreams" / "git-host.yaml"),
)

EXPECTED_WEATHER = Upstream(
    name="weather",
    base_url="http://weather.example.com:8080",
    scheme="http",
    host="weather.example.com",
    port=8080,
    secret=SecretRef(mount="kv", path="fixtures/weather", field="api_key"),
    injection=Injection(Placement.QUERY, param="appid"),
    env=SandboxEnv(
        placeholder="WEATHER_API_KEY", base_url="WEATHER_API_URL", base_path="/data/2.5"
    ),
    purposes={
        "current": Purpose(
            name="current",
            why="Read the current weather for one city.",
            methods=frozenset({"GET"}),
            paths=(_path("/data/2.5/weather"),),
            params=(),
            limits=Limits(),
            allow_fields=frozenset({"stationpassword"}),
        )
    },
    allow_private=True,
    source=str(VALID / "upstreams" / "weather.yaml"),
)

EXPECTED_AGENT = Runtime(
    name="fixture-agent",
    identity=Identity(vault_policy="valetkey-runtime-fixture-agent"),
    allow={"git-host": frozenset({"clone"}), "weather": frozenset({"current"})},
    max_ttl=900,
    max_grants=8,
    source=str(VALID / "runtimes" / "fixture-agent.yaml"),
)


def test_valid_fixtures_load_into_the_expected_objects() -> None:
    policy = load_policy_dir(VALID)

    assert dict(policy.upstreams) == {"git-host": EXPECTED_GIT_HOST, "weather": EXPECTED_WEATHER}
    assert dict(policy.runtimes) == {"fixture-agent": EXPECTED_AGENT}


FROZEN_OBJECTS: list[Any] = [
    pytest.param(lambda p: p, id="policy-set"),
    pytest.param(lambda p: p.upstreams["git-host"], id="upstream"),
    pytest.param(lambda p: p.upstreams["git-host"].secret, id="secret-ref"),
    pytest.param(lambda p: p.upstreams["git-host"].injection, id="injection"),
    pytest.param(lambda p: p.upstreams["weather"].env, id="sandbox-env"),
    pytest.param(lambda p: p.upstreams["git-host"].purposes["clone"], id="purpose"),
    pytest.param(lambda p: p.upstreams["git-host"].purposes["clone"].limits, id="limits"),
    pytest.param(lambda p: p.upstreams["git-host"].purposes["clone"].limits.rate, id="rate"),
    pytest.param(lambda p: p.upstreams["git-host"].purposes["clone"].paths[0], id="path-template"),
    pytest.param(lambda p: p.runtimes["fixture-agent"], id="runtime"),
    pytest.param(lambda p: p.runtimes["fixture-agent"].identity, id="identity"),
]


@pytest.mark.parametrize("get", FROZEN_OBJECTS)
def test_loaded_objects_are_frozen(get: Callable[[PolicySet], Any]) -> None:
    obj = get(load_policy_dir(VALID))

    for field in dataclasses.fields(obj):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field.name, None)


@pytest.mark.parametrize(
    "get",
    [
        pytest.param(lambda p: p.upstreams, id="policy-upstreams"),
        pytest.param(lambda p: p.runtimes, id="policy-runtimes"),
        pytest.param(lambda p: p.upstreams["git-host"].purposes, id="upstream-purposes"),
        pytest.param(lambda p: p.runtimes["fixture-agent"].allow, id="runtime-allow"),
    ],
)
def test_loaded_mappings_are_read_only(get: Callable[[PolicySet], Any]) -> None:
    mapping = get(load_policy_dir(VALID))

    with pytest.raises(TypeError):
        mapping["intruder"] = None
    with pytest.raises(TypeError):
        del mapping[next(iter(mapping))]


def test_loaded_collections_are_immutable() -> None:
    policy = load_policy_dir(VALID)
    clone = policy.upstreams["git-host"].purposes["clone"]

    assert isinstance(clone.methods, frozenset)
    assert isinstance(clone.paths, tuple)
    assert isinstance(clone.params, tuple)
    assert isinstance(policy.runtimes["fixture-agent"].allow["git-host"], frozenset)


def test_hidden_directories_are_skipped(tmp_path: Path) -> None:
    """A Kubernetes ConfigMap volume keeps a second copy of each file under ``..<timestamp>/``."""
    import shutil

    shutil.copytree(VALID, tmp_path / "policies")
    shutil.copytree(VALID, tmp_path / "policies" / "..2026_11_30_01_00_00.123")
    (tmp_path / "policies" / ".hidden.yaml").write_text("not: [valid")
    loaded = load_policy_dir(tmp_path / "policies")
    assert set(loaded.upstreams) == {"git-host", "weather"}


def test_inject_accept_locations() -> None:
    from policies.model import Placement

    shipped = load_policy_dir(Path(__file__).resolve().parents[2] / "policies")
    injection = shipped.upstreams["anthropic"].injection
    assert injection.placement is Placement.HEADER
    assert (injection.header, injection.format) == ("x-api-key", "{secret}")
    assert injection.accept == (("Authorization", "Bearer {secret}"),)
    assert injection.header_names() == {"x-api-key", "authorization"}


@pytest.mark.parametrize(("accept", "message"), [
    pytest.param("accept: {header: Authorization}", "expected a list", id="not-a-list"),
    pytest.param("accept: [{header: Host}]", "framing, routing", id="reserved-header"),
    pytest.param("accept: [{header: Authorization, format: Bearer}]", "exactly once", id="no-secret"),
    pytest.param("accept: [{header: Authorization, extra: 1}]", "expected header", id="unknown-key"),
])
def test_inject_accept_refusals(tmp_path: Path, accept: str, message: str) -> None:
    text = (VALID / "upstreams" / "weather.yaml").read_text()
    doc = text.split("inject:")[0] + "inject:\n  header: X-Key\n  " + accept + "\n" + \
        "env:" + text.split("env:", 1)[1]
    (tmp_path / "up.yaml").write_text(doc)
    with pytest.raises(PolicyLoadError) as info:
        load_policy_dir(tmp_path)
    assert any(message in p.message for p in info.value.problems), info.value
