"""Runs with an egress proxy configured (real OpenBao with its CA, real Redis): destination grants,
the proxy token, the bundle's proxy variables and CA file, revocation of destinations."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from broker.app import create_app
from broker.grants import RunRequest
from broker.run_tokens import run_claims
from broker.services import Services
from broker.settings import BrokerSettings
from contract.ca import load_certs
from contract.claims import MAX_TOKEN_BYTES, GrantClaim, params_view
from contract.env import SettingsError
from contract.errors import BadRequest, TokenInvalid
from policies.model import PolicySet
from tests.support.broker_stack import Broker, broker_settings
from tests.support.servers import ThreadedServer
from valetkey.bootstrap import open_client
from valetkey.dev.services import RedisServer
from valetkey.proxy_bootstrap import read_public

PROXY = "http://127.0.0.1:8480"
PYPI = {"destination": "pypi", "purpose": "connect"}
DOCS = {"upstream": "python-docs", "purpose": "read"}
CHAT = {"upstream": "openai", "purpose": "chat"}
# what the issue names, and npm's own (a global npmrc's `cafile` hides NODE_EXTRA_CA_CERTS)
CA_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT",
           "NODE_EXTRA_CA_CERTS", "npm_config_cafile")
ROOTS = "-----BEGIN CERTIFICATE-----\nTEST-ROOTS\n-----END CERTIFICATE-----\n"


def codeload(owner: str = "acme", repo: str = "widgets") -> dict[str, Any]:
    return {"upstream": "github-codeload", "purpose": "download", "params": {"owner": owner, "repo": repo}}


@pytest.fixture(scope="module")
def brokers(bootstrapped_vault: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Broker]]:
    """Brokers with a redis-server of their own (they revoke destinations): egress proxy, both,
    and one whose CA cannot be read."""
    roots = tmp_path_factory.mktemp("roots") / "roots.pem"
    roots.write_text(ROOTS)
    common = {"VALETKEY_PROXY_URL": PROXY, "VALETKEY_PROXY_TRUST_FILE": str(roots)}
    variants = {"proxy": {"VALETKEY_EGRESS": "proxy"}, "both": {"VALETKEY_EGRESS": "both"},
                "no-ca": {"VALETKEY_PROXY_CA_MOUNT": "nosuch"}}
    with RedisServer() as redis, ExitStack() as stack:
        out = {}
        for name, extra in variants.items():
            settings = broker_settings(bootstrapped_vault, redis.url, **common, **extra)
            server = stack.enter_context(ThreadedServer(create_app(settings)))
            out[name] = Broker(server.url, settings, bootstrapped_vault)
        yield out


def mint(broker: Broker, *grants: dict[str, Any], runtime: str = "coding-agent") -> Any:
    """Mint, waiting (at most 5 s) for the broker's first background read of the CA."""
    for _ in range(50):
        response = broker.mint(runtime, list(grants))
        if response.status_code != 503:
            break
        time.sleep(0.1)
    return response


GRANT_REFUSALS = [
    pytest.param([{"upstream": "pypi", "destination": "pypi", "purpose": "connect"}], "coding-agent",
                 400, "invalid_request", id="upstream-and-destination-keys"),
    pytest.param([{"destination": "pypi", "purpose": "install"}], "coding-agent", 400,
                 "unknown_purpose", id="tunnel-has-only-connect"),
    pytest.param([{"destination": "nosuch", "purpose": "connect"}], "coding-agent", 400,
                 "unknown_audience", id="unknown-destination"),
    pytest.param([PYPI], "notifier", 403, "purpose_not_allowed", id="runtime-not-granted-destination"),
    pytest.param([{**PYPI, "params": {"a": "b"}}], "coding-agent", 400, "extra_param",
                 id="tunnel-takes-no-params"),
    pytest.param([{"destination": "github-codeload", "purpose": "download"}], "coding-agent", 400,
                 "missing_param", id="destination-params-required"),
    pytest.param([codeload(owner="..")], "coding-agent", 400, "param_widens_template",
                 id="destination-param-widens"),
    pytest.param([PYPI, {"upstream": "pypi", "purpose": "connect"}], "coding-agent", 400,
                 "duplicate_grant", id="same-destination-grant-twice-any-key"),
    pytest.param([codeload(owner="a" * 200, repo=f"{'r' * 199}{i}") for i in range(8)], "coding-agent",
                 400, "token_too_large", id="grants-over-the-token-size-limit"),
]


@pytest.mark.parametrize(("grants", "runtime", "status", "code"), GRANT_REFUSALS)
def test_destination_grant_refusals(brokers: dict[str, Broker], grants: list[dict[str, Any]],
                                    runtime: str, status: int, code: str) -> None:
    response = mint(brokers["proxy"], *grants, runtime=runtime)

    assert (response.status_code, response.json()["error"]) == (status, code), response.text


def test_destination_grants_need_a_proxy(broker: Broker) -> None:
    response = broker.mint("coding-agent", [PYPI])

    assert (response.status_code, response.json()["error"]) == (400, "unknown_audience")
    assert "egress proxy" in response.json()["detail"]


@pytest.mark.anyio
async def test_proxy_token_carries_every_grant_as_name_slash_purpose(brokers: dict[str, Broker]) -> None:
    broker = brokers["proxy"]
    response = mint(broker, PYPI, DOCS, CHAT, codeload())
    assert response.status_code == 201, response.text
    bundle = response.json()
    token = bundle["env"]["HTTPS_PROXY"].removeprefix("http://run:").removesuffix("@127.0.0.1:8480")

    async with broker.verifier("egress") as egress, broker.verifier("openai") as openai:
        claims = await egress.verify(token)
        upstream = await openai.verify(bundle["env"]["OPENAI_API_KEY"])
        with pytest.raises(TokenInvalid) as info:
            await openai.verify(token)
    assert [(g.purpose, dict(g.params)) for g in claims.grants] == [
        ("pypi/connect", {}), ("python-docs/read", {}), ("openai/chat", {}),
        ("github-codeload/download", {"owner": "acme", "repo": "widgets"})]
    assert (claims.aud, claims.sub, upstream.sub) == ("egress", bundle["run_id"], bundle["run_id"])
    assert [g.purpose for g in upstream.grants] == ["chat"]
    assert info.value.code == "audience_mismatch"
    assert len(token) <= MAX_TOKEN_BYTES
    with broker.client(broker.vault.runtime_token("coding-agent")) as client:
        record = client.get(f"/v1/runs/{bundle['run_id']}").json()
    assert record["audiences"] == ["openai", "egress"]


def test_bundle_in_proxy_mode(brokers: dict[str, Broker]) -> None:
    bundle = mint(brokers["proxy"], PYPI, CHAT).json()
    env, token = bundle["env"], None
    token = env["HTTP_PROXY"].split("run:", 1)[1].split("@", 1)[0]

    assert {env[v] for v in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")} == {
        f"http://run:{token}@127.0.0.1:8480"}
    assert (env["NO_PROXY"], env["no_proxy"], env["VALETKEY_PROXY"]) == ("", "", PROXY)
    assert {env[v] for v in CA_VARS} == {"/etc/valetkey/ca.pem"}
    assert "OPENAI_BASE_URL" not in env  # clients use api.openai.com, through the proxy
    assert env["OPENAI_API_KEY"] != token
    assert (bundle["gateways"], env["VALETKEY_GATEWAYS"]) == ({}, "")
    with open_client(brokers["proxy"].vault.addr, brokers["proxy"].vault.root_token) as client:
        public = read_public(client)
    pem = bundle["files"]["/etc/valetkey/ca.pem"]
    assert list(bundle["files"]) == ["/etc/valetkey/ca.pem"]
    assert pem.endswith(ROOTS)  # the proxy CA (current, previous), then the trusted roots
    served = load_certs(pem.removesuffix(ROOTS))
    assert 1 <= len(served) <= 2
    assert set(served) & set(load_certs(public))  # (another test may have rotated since)
    assert f"HTTPS_PROXY=http://run:{token}@127.0.0.1:8480\n" in bundle["dotenv"]


def test_bundle_in_both_mode_sends_gateways_around_the_proxy(brokers: dict[str, Broker]) -> None:
    env = mint(brokers["both"], CHAT, {"upstream": "anthropic", "purpose": "messages"}).json()["env"]

    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:9102/v1"
    assert env["ANTHROPIC_BASE_URL"] == "http://gateway-anthropic.valetkey.test:8080"
    assert env["NO_PROXY"] == env["no_proxy"] == "127.0.0.1,gateway-anthropic.valetkey.test"
    assert env["HTTPS_PROXY"].startswith("http://run:")


def test_no_proxy_no_proxy_variables(broker: Broker) -> None:
    bundle = broker.mint("coding-agent", [CHAT]).json()

    assert bundle["files"] == {}
    assert not {"HTTPS_PROXY", "SSL_CERT_FILE", "NO_PROXY"} & set(bundle["env"])


def test_unreadable_ca_refuses_to_mint(brokers: dict[str, Broker]) -> None:
    response = brokers["no-ca"].mint("coding-agent", [CHAT])

    assert (response.status_code, response.json()["error"]) == (503, "proxy_ca_unavailable")


def test_revoking_a_destination_blocks_minting_it_and_shows_on_runs(brokers: dict[str, Broker]) -> None:
    broker = brokers["proxy"]
    run = mint(broker, PYPI).json()
    with broker.client(broker.vault.admin_token) as admin:
        revoked = admin.post("/v1/revocations", json={"scope": "upstream", "name": "pypi", "reason": "t"})
        try:
            refused = mint(broker, PYPI)
            allowed = mint(broker, DOCS)
            shown = admin.get(f"/v1/runs/{run['run_id']}").json()
        finally:
            lifted = admin.delete("/v1/revocations/upstream/pypi")
        unknown = admin.post("/v1/revocations", json={"scope": "upstream", "name": "nosuch"})

    assert revoked.status_code == 201, revoked.text
    assert (refused.status_code, refused.json()["error"]) == (403, "revoked")
    assert allowed.status_code == 201
    assert (shown["state"], shown["revoked_scope"]) == ("revoked", "upstream")
    assert lifted.status_code == 200
    assert (unknown.status_code, unknown.json()["error"]) == (404, "unknown_revocation_target")


def _request(*names: str, params: dict[str, str] | None = None) -> RunRequest:
    grant = GrantClaim("connect", params_view(params or {}))
    return RunRequest(ttl=900, by_upstream={n: (grant,) for n in names})


@pytest.mark.parametrize(
    ("names", "fits"),
    [
        pytest.param([f"destination-{i:02d}" for i in range(64)], False, id="64-long-names-refused"),
        pytest.param([f"d{i:02d}" for i in range(64)], True, id="64-short-names-fit"),
        pytest.param(["a" * 63] * 1, True, id="one-longest-name"),
    ],
)
def test_proxy_token_size_is_checked_before_signing(names: list[str], fits: bool) -> None:
    settings = broker_settings_for_size()
    kwargs = {"policies": PolicySet(), "proxy": settings.proxy, "issuer": "http://broker.valetkey.test",
              "run_id": "run_" + "x" * 22, "runtime": "coding-agent", "now": 1_900_000_000,
              "key_name": "valetkey-tokens"}
    if fits:
        assert run_claims(request=_request(*names), **kwargs).proxy is not None  # type: ignore[arg-type]
    else:
        with pytest.raises(BadRequest) as info:
            run_claims(request=_request(*names), **kwargs)  # type: ignore[arg-type]
        assert info.value.code == "token_too_large"


def broker_settings_for_size() -> BrokerSettings:
    return BrokerSettings.from_env({"VAULT_TOKEN": "t", "VALETKEY_PROXY_URL": PROXY})


SETTINGS_REFUSALS = [
    pytest.param({"VALETKEY_EGRESS": "proxy"}, "needs VALETKEY_PROXY_URL", id="proxy-egress-without-url"),
    pytest.param({"VALETKEY_PROXY_URL": PROXY, "VALETKEY_EGRESS": "all"}, "gateway, proxy or both",
                 id="bad-egress"),
    pytest.param({"VALETKEY_PROXY_URL": "http://u:p@127.0.0.1:8480"}, "host:port only", id="userinfo"),
    pytest.param({"VALETKEY_PROXY_URL": "http://127.0.0.1:8480/x"}, "host:port only", id="path"),
    pytest.param({"VALETKEY_PROXY_URL": "socks5://127.0.0.1:1080"}, "not a http/https URL", id="scheme"),
    pytest.param({"VALETKEY_PROXY_AUDIENCE": "Egress!"}, "VALETKEY_PROXY_AUDIENCE", id="bad-audience"),
    pytest.param({"VALETKEY_SANDBOX_CA_PATH": "ca.pem"}, "not an absolute file path", id="relative-ca"),
    pytest.param({"VALETKEY_SANDBOX_CA_PATH": "/etc/../ca.pem"}, "not an absolute file path",
                 id="dotdot-ca"),
    pytest.param({"VALETKEY_PROXY_URL": PROXY, "VALETKEY_PROXY_TRUST_FILE": "/nonexistent.pem"},
                 "is not a file", id="missing-trust-file"),
]


@pytest.mark.parametrize(("env", "message"), SETTINGS_REFUSALS)
def test_proxy_settings_refusals(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as info:
        BrokerSettings.from_env({"VAULT_TOKEN": "t", **env})

    assert message in str(info.value)
    assert "u:p" not in str(info.value)


def test_proxy_audience_may_not_be_a_policy_name(tmp_path: Path) -> None:
    settings = BrokerSettings.from_env({"VAULT_TOKEN": "t", "VALETKEY_PROXY_URL": PROXY,
                                        "VALETKEY_PROXY_AUDIENCE": "pypi"})
    with pytest.raises(SettingsError, match="must not collide"):
        Services.build(settings)


def test_trust_file_defaults_to_a_system_or_certifi_bundle() -> None:
    settings = BrokerSettings.from_env({"VAULT_TOKEN": "t", "VALETKEY_PROXY_URL": PROXY})

    assert settings.proxy.trust_file is not None
    assert settings.proxy.trust_file.is_file()
    assert settings.proxy.audience == "egress"


def test_run_create_writes_bundle_files(brokers: dict[str, Broker], tmp_path: Path) -> None:
    from click.testing import CliRunner

    from valetkey.cli import main

    broker = brokers["proxy"]
    assert mint(broker, PYPI).status_code == 201  # the broker has read its CA
    env = {"VAULT_TOKEN": broker.vault.runtime_token("coding-agent")}
    result = CliRunner().invoke(main, ["run", "create", "--broker", broker.url, "--grant", "pypi:connect",
                                       "--files-dir", str(tmp_path / "sandbox"), "--format", "env"], env=env)

    assert result.exit_code == 0, result.output
    written = tmp_path / "sandbox" / "etc" / "valetkey" / "ca.pem"
    assert load_certs(written.read_text().removesuffix(ROOTS))
    lines = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert {lines[v] for v in CA_VARS} == {str(written.resolve())}
    assert lines["HTTPS_PROXY"].startswith("http://run:")


def test_coding_agent_at_max_grants_with_longest_github_names_fits() -> None:
    """8 grants (its max_grants), GitHub's longest owner (39) and repo (100) names: every token,
    the proxy token with all 8 grants included, stays under MAX_TOKEN_BYTES."""
    from broker.grants import parse_run_request
    from policies.load import SHIPPED_POLICY_DIR, load_policy_dir

    policies = load_policy_dir(SHIPPED_POLICY_DIR)
    runtime = policies.runtimes["coding-agent"]
    repo = {"owner": "o" * 39, "repo": "r" * 100}
    grants = [{"upstream": "github", "purpose": p, "params": repo}
              for p in ("read_repo", "read_issues", "open_pull_request")]
    grants += [{"upstream": "github-git", "purpose": p, "params": repo} for p in ("clone", "push")]
    grants += [codeload(**repo), PYPI, {**DOCS}]
    assert len(grants) == runtime.max_grants
    request = parse_run_request({"grants": grants}, runtime, policies, 900, proxy=True)
    claims = run_claims(request=request, policies=policies, proxy=broker_settings_for_size().proxy,
                        issuer="http://valetkey-broker.example.internal:8400", run_id="run_" + "x" * 22,
                        runtime="coding-agent", now=1_900_000_000, key_name="valetkey-tokens")

    from contract.claims import token_bytes

    sizes = [token_bytes(c, "valetkey-tokens") for c in claims.all()]
    assert max(sizes) <= MAX_TOKEN_BYTES
    assert claims.proxy is not None
    assert len(claims.proxy.grants) == 8


def test_readyz_reports_the_proxy_ca(brokers: dict[str, Broker]) -> None:
    assert mint(brokers["proxy"], CHAT).status_code == 201
    with brokers["proxy"].client() as client:
        ready = client.get("/readyz")
    with brokers["no-ca"].client() as client:
        not_ready = client.get("/readyz")

    assert (ready.status_code, ready.json()["checks"]["proxy_ca"]) == (200, True)
    assert (not_ready.status_code, not_ready.json()["checks"]["proxy_ca"]) == (503, False)
