"""Field checks: one edit to a valid document, one problem with the expected rule and message."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.load import PolicyLoadError, load_policy_dir

UPSTREAM = """\
version: 1
kind: upstream
name: demo
base_url: https://api.example.com
secret: {path: fixtures/demo, field: token}
inject:
  header: Authorization
  format: "Bearer {secret}"
env:
  placeholder: DEMO_TOKEN
  base_url: DEMO_API_URL
purposes:
  read_item:
    why: Read one item.
    methods: [GET]
    params: [item]
    paths:
      - /v1/items/{item}
"""

RUNTIME = """\
version: 1
kind: runtime
name: demo-agent
identity: {vault_policy: valetkey-runtime-demo-agent}
max_ttl: 15m
allow:
  demo: [read_item]
"""

PURPOSE = "upstream demo purpose read_item"


def edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def write(tmp_path: Path, upstream: str = UPSTREAM, runtime: str = RUNTIME) -> Path:
    (tmp_path / "upstream.yaml").write_text(upstream)
    (tmp_path / "runtime.yaml").write_text(runtime)
    return tmp_path


def test_base_documents_are_valid(tmp_path: Path) -> None:
    policy = load_policy_dir(write(tmp_path))

    assert list(policy.upstreams) == ["demo"]
    assert list(policy.runtimes) == ["demo-agent"]


UPSTREAM_EDITS = [
    pytest.param("name: demo", "name: Demo", "upstream Demo name", "does not match",
                 id="name-upper-case"),
    pytest.param("name: demo\n", "", "upstream ?", "missing key 'name'", id="name-missing"),
    pytest.param("name: demo\n", "name: demo\ndescription: [a, b]\n", "upstream demo description",
                 "expected a non-empty string", id="description-not-text"),
    pytest.param("name: demo\n", "name: demo\nallow_private: yes please\n",
                 "upstream demo allow_private", "true or false", id="allow-private-not-bool"),
    pytest.param("https://api.example.com", "https://api.example.com:99999",
                 "upstream demo base_url", "is not a URL", id="base-url-port-out-of-range"),
    pytest.param("https://api.example.com", "https://*.example.com", "upstream demo base_url",
                 "exactly one host", id="base-url-wildcard-host"),
    pytest.param("https://api.example.com", "https://exa mple.com", "upstream demo base_url",
                 "exactly one host", id="base-url-space-in-host"),
    pytest.param("https://api.example.com", "http://0x7f.1", "upstream demo base_url",
                 "exactly one host", id="base-url-hex-ipv4"),
    pytest.param("https://api.example.com", "https://-api.example.com", "upstream demo base_url",
                 "exactly one host", id="base-url-label-starts-with-dash"),
    pytest.param("https://api.example.com", "'https://'", "upstream demo base_url", "host",
                 id="base-url-no-host"),
    pytest.param("https://api.example.com", "api.example.com", "upstream demo base_url",
                 "scheme '' is not http or https", id="base-url-no-scheme"),
    pytest.param("https://api.example.com", "''", "upstream demo base_url", "non-empty string",
                 id="base-url-empty"),
    pytest.param("{path: fixtures/demo, field: token}",
                 "{mount: ../sys, path: fixtures/demo, field: token}", "upstream demo secret",
                 "'.' or '..' segment", id="secret-mount-dotdot"),
    pytest.param("{path: fixtures/demo, field: token}", "{path: fixtures/demo}",
                 "upstream demo secret", "missing key 'field'", id="secret-field-missing"),
    pytest.param("{path: fixtures/demo, field: token}", "{path: /fixtures/demo, field: token}",
                 "upstream demo secret path", "does not match", id="secret-path-absolute"),
    pytest.param("  header: Authorization\n", "  header: Authorization\n  basic: {username: x}\n",
                 "upstream demo inject", "unknown key 'basic'", id="inject-two-placements"),
    pytest.param("header: Authorization", "header: Author ization", "upstream demo inject header",
                 "does not match", id="inject-header-name"),
    pytest.param('"Bearer {secret}"', '"Bearer {secret} {secret}"', "upstream demo inject format",
                 "exactly once", id="format-secret-twice"),
    pytest.param('"Bearer {secret}"', '"Bearer {secret}}"', "upstream demo inject format",
                 "stray brace", id="format-stray-brace"),
    pytest.param('"Bearer {secret}"', '"Bearer {token} {secret}"', "upstream demo inject format",
                 "stray brace", id="format-other-field"),
    pytest.param('"Bearer {secret}"', '"Bearer\\t{secret}"', "upstream demo inject format",
                 "non-printable", id="format-tab"),
    pytest.param('  header: Authorization\n  format: "Bearer {secret}"\n',
                 "  basic: {username: 'a:b'}\n", "upstream demo inject basic username",
                 "contains ':'", id="basic-username-colon"),
    pytest.param('  header: Authorization\n  format: "Bearer {secret}"\n',
                 "  basic: {username: ''}\n", "upstream demo inject basic username",
                 "non-empty string", id="basic-username-empty"),
    pytest.param('  header: Authorization\n  format: "Bearer {secret}"\n',
                 "  basic: {username: x, password: y}\n", "upstream demo inject basic",
                 "unknown key 'password'", id="basic-password"),
    pytest.param('  header: Authorization\n  format: "Bearer {secret}"\n',
                 "  query: api key\n", "upstream demo inject query", "does not match",
                 id="query-param-name"),
    pytest.param("  base_url: DEMO_API_URL\n", "  base_url: DEMO_API_URL\n  base_path: false\n",
                 "upstream demo env base_path", "not a path", id="base-path-false"),
    pytest.param("  base_url: DEMO_API_URL\n", "  base_url: DEMO_API_URL\n  base_path: v1\n",
                 "upstream demo env base_path", "not a path", id="base-path-relative"),
    pytest.param("  base_url: DEMO_API_URL\n", "  base_url: DEMO_API_URL\n  base_path: /v1/..\n",
                 "upstream demo env base_path", "not a path", id="base-path-dotdot"),
    pytest.param("  base_url: DEMO_API_URL\n", "  base_url: DEMO_TOKEN\n", "upstream demo env",
                 "same variable", id="env-same-variable"),
    pytest.param("placeholder: DEMO_TOKEN", "placeholder: demo_token",
                 "upstream demo env placeholder", "does not match", id="env-lower-case"),
    pytest.param(UPSTREAM[UPSTREAM.index("purposes:"):], "purposes: {}\n",
                 "upstream demo purposes", "no purposes", id="purposes-empty"),
    pytest.param(UPSTREAM[UPSTREAM.index("purposes:"):], "purposes: [read_item]\n",
                 "upstream demo purposes", "expected a mapping", id="purposes-list"),
    pytest.param("  read_item:", "  Read-Item:", "upstream demo purpose Read-Item",
                 "purpose name", id="purpose-name"),
    pytest.param("why: Read one item.", "why: '   '", f"{PURPOSE} why", "one-line",
                 id="why-blank"),
    pytest.param("why: Read one item.", "why: [Read, one, item]", f"{PURPOSE} why", "one-line",
                 id="why-list"),
    pytest.param("methods: [GET]", "methods: []", f"{PURPOSE} methods", "non-empty list",
                 id="methods-empty"),
    pytest.param("methods: [GET]", "methods: GET", f"{PURPOSE} methods", "non-empty list",
                 id="methods-string"),
    pytest.param("methods: [GET]", "methods: [FETCH]", f"{PURPOSE} methods",
                 "unsupported methods ['FETCH']", id="methods-unknown"),
    pytest.param("methods: [GET]", "methods: [connect]", f"{PURPOSE} methods",
                 "unsupported methods ['CONNECT']", id="methods-connect"),
    pytest.param("    paths:\n      - /v1/items/{item}\n", "    paths: []\n", f"{PURPOSE} paths",
                 "non-empty list", id="paths-empty"),
    pytest.param("params: [item]", "params: item", f"{PURPOSE} params", "list of parameter names",
                 id="params-string"),
    # The broken template is the only problem: its {item} must not also look like an unknown param.
    pytest.param("/v1/items/{item}", '"/v1/items/{item}/*"', f"{PURPOSE} paths[0]", "wildcard",
                 id="params-of-broken-template"),
    pytest.param("      - /v1/items/{item}\n", "      - /v1/items/{item}\n    limits: null\n",
                 f"{PURPOSE} limits", "expected a mapping", id="limits-null"),
    pytest.param("      - /v1/items/{item}\n", "      - /v1/items/{item}\n    limits: {burst: 3}\n",
                 f"{PURPOSE} limits", "unknown key 'burst'", id="limits-unknown-key"),
    pytest.param("      - /v1/items/{item}\n",
                 "      - /v1/items/{item}\n    limits: {max_body: 0}\n",
                 f"{PURPOSE} limits max_body", "must be positive", id="max-body-zero"),
    pytest.param("      - /v1/items/{item}\n",
                 "      - /v1/items/{item}\n    limits: {rate: '0 per 1m'}\n",
                 f"{PURPOSE} limits rate", "must be positive", id="rate-zero"),
]


@pytest.mark.parametrize(("old", "new", "rule", "message"), UPSTREAM_EDITS)
def test_upstream_edit(tmp_path: Path, old: str, new: str, rule: str, message: str) -> None:
    write(tmp_path, upstream=edit(UPSTREAM, old, new))

    with pytest.raises(PolicyLoadError) as info:
        load_policy_dir(tmp_path)

    problems = info.value.problems
    assert len(problems) == 1, problems
    assert Path(problems[0].file).name == "upstream.yaml"
    assert rule in problems[0].rule
    assert message in problems[0].message
    assert problems[0].fix.strip()


RUNTIME_EDITS = [
    pytest.param("max_ttl: 15m", "max_ttl: 15m\nmax_grants: 0", "runtime demo-agent max_grants",
                 "not 1..64", id="max-grants-zero"),
    pytest.param("max_ttl: 15m", "max_ttl: 15m\nmax_grants: 65", "runtime demo-agent max_grants",
                 "not 1..64", id="max-grants-too-many"),
    pytest.param("max_ttl: 15m", "max_ttl: 15m\nmax_grants: true", "runtime demo-agent max_grants",
                 "not 1..64", id="max-grants-bool"),
    pytest.param("max_ttl: 15m", "max_ttl: true", "runtime demo-agent max_ttl", "boolean",
                 id="max-ttl-bool"),
    pytest.param("max_ttl: 15m", "max_ttl: 0", "runtime demo-agent max_ttl", "must be positive",
                 id="max-ttl-zero"),
    pytest.param("{vault_policy: valetkey-runtime-demo-agent}", "{}", "runtime demo-agent identity",
                 "exactly one of", id="identity-empty"),
    pytest.param("{vault_policy: valetkey-runtime-demo-agent}", "{github_user: octocat}",
                 "runtime demo-agent identity", "unknown key 'github_user'", id="identity-unknown"),
    pytest.param("{vault_policy: valetkey-runtime-demo-agent}", "{vault_policy: ''}",
                 "runtime demo-agent identity vault_policy", "non-empty string",
                 id="identity-empty-value"),
    pytest.param("demo: [read_item]", "demo: []", "runtime demo-agent allow demo",
                 "list of purpose names", id="allow-empty-list"),
    pytest.param("demo: [read_item]", "demo: read_item", "runtime demo-agent allow demo",
                 "list of purpose names", id="allow-string"),
    pytest.param("name: demo-agent\n", "name: demo-agent\nowner: me\n", "runtime demo-agent",
                 "unknown key 'owner'", id="runtime-unknown-key"),
    pytest.param("name: demo-agent\n", "name: demo_agent\n", "runtime demo_agent name",
                 "does not match", id="runtime-name-underscore"),
]


@pytest.mark.parametrize(("old", "new", "rule", "message"), RUNTIME_EDITS)
def test_runtime_edit(tmp_path: Path, old: str, new: str, rule: str, message: str) -> None:
    write(tmp_path, runtime=edit(RUNTIME, old, new))

    with pytest.raises(PolicyLoadError) as info:
        load_policy_dir(tmp_path)

    problems = info.value.problems
    assert len(problems) == 1, problems
    assert Path(problems[0].file).name == "runtime.yaml"
    assert rule in problems[0].rule
    assert message in problems[0].message
    assert problems[0].fix.strip()


@pytest.mark.parametrize(
    ("base_url", "origin", "host", "port"),
    [
        pytest.param("https://API.Example.com/", "https://api.example.com", "api.example.com", 443,
                     id="lower-case-and-trailing-slash"),
        pytest.param("https://api.example.com:443", "https://api.example.com", "api.example.com",
                     443, id="default-https-port-dropped"),
        pytest.param("http://api.example.com:80", "http://api.example.com", "api.example.com", 80,
                     id="default-http-port-dropped"),
        pytest.param("http://api.example.com:443", "http://api.example.com:443", "api.example.com",
                     443, id="https-port-on-http-kept"),
        pytest.param("http://127.0.0.1:8080", "http://127.0.0.1:8080", "127.0.0.1", 8080,
                     id="ipv4"),
        pytest.param("https://[::1]:8443", "https://[::1]:8443", "::1", 8443, id="ipv6"),
        pytest.param("http://my_api:9000", "http://my_api:9000", "my_api", 9000,
                     id="container-service-name"),
    ],
)
def test_base_url_becomes_an_origin(
    tmp_path: Path, base_url: str, origin: str, host: str, port: int
) -> None:
    write(tmp_path, upstream=edit(UPSTREAM, "https://api.example.com", f"'{base_url}'"))

    upstream = load_policy_dir(tmp_path).upstreams["demo"]

    assert (upstream.base_url, upstream.origin, upstream.host, upstream.port) == (
        origin, origin, host, port,
    )


def test_folded_why_is_one_line(tmp_path: Path) -> None:
    folded = "why: >\n      Read one item,\n      folded by YAML.\n"
    write(tmp_path, upstream=edit(UPSTREAM, "why: Read one item.\n", folded))

    purpose = load_policy_dir(tmp_path).upstreams["demo"].purposes["read_item"]

    assert purpose.why == "Read one item, folded by YAML."
