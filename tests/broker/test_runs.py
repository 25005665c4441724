"""Minting runs through a real broker (real OpenBao transit, real Redis): bundles and refusals."""

from __future__ import annotations

import json
import logging
import shlex
import socket
from typing import Any

import anyio
import pytest

from contract.errors import TokenInvalid
from tests.support.broker_stack import Broker

READ_REPO = {"upstream": "github", "purpose": "read_repo", "params": {"owner": "acme", "repo": "widgets"}}
CHAT = {"upstream": "openai", "purpose": "chat"}
SLACK = {"upstream": "slack", "purpose": "post_message"}


def test_bundle_has_one_token_per_upstream_and_gateway_urls(broker: Broker) -> None:
    issue = {"upstream": "github", "purpose": "read_issues", "params": {"owner": "acme", "repo": "widgets"}}
    response = broker.mint("coding-agent", [READ_REPO, issue, CHAT], ttl="10m")
    assert response.status_code == 201, response.text
    bundle = response.json()
    assert bundle["run_id"].startswith("run_")
    assert bundle["runtime"] == "coding-agent"
    assert bundle["expires_in"] == 600
    env = bundle["env"]
    assert set(env) == {"GITHUB_TOKEN", "GITHUB_API_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL",
                        "VALETKEY_RUN_ID", "VALETKEY_GATEWAYS"}
    assert env["VALETKEY_RUN_ID"] == bundle["run_id"]
    assert env["VALETKEY_GATEWAYS"] == "github=http://127.0.0.1:9101,openai=http://127.0.0.1:9102"
    assert env["GITHUB_API_URL"] == "http://127.0.0.1:9101"
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:9102/v1"
    assert env["GITHUB_TOKEN"] != env["OPENAI_API_KEY"]
    parsed = dict(line.split("=", 1) for line in bundle["dotenv"].splitlines())
    assert {k: shlex.split(v)[0] for k, v in parsed.items()} == env
    assert response.headers["cache-control"] == "no-store"


def test_gateway_url_template_applies_to_unlisted_upstreams(broker: Broker) -> None:
    bundle = broker.mint("notifier", [SLACK]).json()
    assert bundle["env"]["SLACK_API_URL"] == "http://gateway-slack.valetkey.test:8080/api"


@pytest.mark.anyio
async def test_minted_tokens_verify_for_their_own_audience_only(broker: Broker) -> None:
    bundle = broker.mint("coding-agent", [READ_REPO, CHAT]).json()
    async with broker.verifier("github") as github:
        claims = await github.verify(bundle["env"]["GITHUB_TOKEN"])
        assert claims.sub == bundle["run_id"]
        assert claims.aud == "github"
        assert claims.client_id == "coding-agent"
        assert claims.iss == "http://broker.valetkey.test"
        assert claims.exp - claims.iat == 900  # default TTL 15 min
        assert [(g.purpose, dict(g.params)) for g in claims.grants] == [
            ("read_repo", {"owner": "acme", "repo": "widgets"})
        ]
        with pytest.raises(TokenInvalid) as info:
            await github.verify(bundle["env"]["OPENAI_API_KEY"])
        assert (info.value.code, info.value.check) == ("audience_mismatch", "aud")


def _grant(upstream: str, purpose: str, **params: str) -> dict[str, Any]:
    return {"upstream": upstream, "purpose": purpose, "params": params}


REFUSALS = [
    pytest.param("coding-agent", {"grants": [_grant("gitlab", "read")]}, 400, "unknown_audience",
                 id="unknown-upstream"),
    pytest.param("coding-agent", {"grants": [_grant("github", "delete_repo", owner="a", repo="b")]}, 400,
                 "unknown_purpose", id="unknown-purpose"),
    pytest.param("notifier", {"grants": [READ_REPO]}, 403, "purpose_not_allowed",
                 id="upstream-outside-runtime-policy"),
    pytest.param("notifier", {"grants": [_grant("anthropic", "list_models")]}, 403,
                 "purpose_not_allowed", id="purpose-outside-runtime-policy"),
    pytest.param("coding-agent", {"grants": [_grant("github", "read_repo", owner="acme")]}, 400,
                 "missing_param", id="missing-param"),
    pytest.param("coding-agent", {"grants": [_grant("github", "read_repo", owner="a", repo="b", x="c")]},
                 400, "extra_param", id="extra-param"),
    pytest.param("coding-agent", {"grants": [_grant("openai", "chat", model="gpt")]}, 400, "extra_param",
                 id="param-on-paramless-purpose"),
    *[
        pytest.param("coding-agent", {"grants": [_grant("github", "read_repo", owner="acme", repo=v)]},
                     400, "param_widens_template", id=f"widening-{label}")
        for label, v in [("dotdot", ".."), ("dot", "."), ("slash", "a/b"), ("star", "*"),
                         ("encoded-slash", "a%2fb"), ("empty", ""), ("space", "a b"),
                         ("query", "a?b"), ("newline", "a\nb"), ("long", "a" * 500)]
    ],
    pytest.param("notifier", {"grants": [SLACK], "ttl": "31m"}, 400, "ttl_too_long", id="ttl-over-max"),
    pytest.param("notifier", {"grants": [SLACK], "ttl": "soon"}, 400, "invalid_request", id="ttl-garbage"),
    pytest.param("notifier", {"grants": [SLACK], "ttl": -5}, 400, "invalid_request", id="ttl-negative"),
    pytest.param("notifier", {"grants": [SLACK, _grant("anthropic", "messages"), SLACK]}, 400,
                 "too_many_grants", id="too-many-grants"),
    pytest.param("coding-agent", {"grants": [CHAT, CHAT]}, 400, "duplicate_grant", id="duplicate-grant"),
    pytest.param("notifier", {"grants": []}, 400, "invalid_request", id="no-grants"),
    pytest.param("notifier", {"grants": [SLACK], "admin": True}, 400, "invalid_request", id="unknown-field"),
    pytest.param("notifier", {"grants": [{"upstream": "slack"}]}, 400, "invalid_request",
                 id="grant-without-purpose"),
    pytest.param("notifier", {"grants": [{**SLACK, "params": {"a": 1}}]}, 400, "invalid_request",
                 id="non-string-param"),
    pytest.param("notifier", {"grants": "slack"}, 400, "invalid_request", id="grants-not-list"),
]


@pytest.mark.parametrize(("runtime", "body", "status", "code"), REFUSALS)
def test_mint_refusals(broker: Broker, runtime: str, body: dict[str, Any], status: int, code: str) -> None:
    with broker.client(broker.vault.runtime_token(runtime)) as client:
        response = client.post("/v1/runs", json=body)
    assert (response.status_code, response.json()["error"]) == (status, code), response.text
    assert response.json()["detail"]


RAW_REFUSALS = [
    pytest.param(b"{not json", {}, 400, "invalid_json", id="invalid-json"),
    pytest.param(b"[]", {}, 400, "invalid_json", id="json-array"),
    pytest.param(b'{"grants": [' + b'{"upstream": "x", "purpose": "y"},' * 5000 + b"{}]}", {}, 413,
                 "body_too_large", id="oversized-body"),
]


@pytest.mark.parametrize(("raw", "headers", "status", "code"), RAW_REFUSALS)
def test_malformed_bodies(
    broker: Broker, raw: bytes, headers: dict[str, str], status: int, code: str
) -> None:
    with broker.client(broker.vault.runtime_token("notifier")) as client:
        response = client.post("/v1/runs", content=raw, headers=headers)
    assert (response.status_code, response.json()["error"]) == (status, code)


def test_declared_oversize_is_refused_before_reading(broker: Broker) -> None:
    """A Content-Length over the cap is answered 413 at once, without waiting for the body."""
    port = int(broker.url.rsplit(":", 1)[1])
    token = broker.vault.runtime_token("notifier")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/runs HTTP/1.1\r\nHost: broker\r\nContent-Type: application/json\r\n"
            + f"X-Vault-Token: {token}\r\nContent-Length: 99999999\r\n\r\n{{".encode()
        )
        answer = ""
        while "body_too_large" not in answer and (chunk := sock.recv(65536)):
            answer += chunk.decode()
    assert answer.startswith("HTTP/1.1 413")
    assert '"error": "body_too_large"' in answer


CALLER_REFUSALS = [
    pytest.param({}, 401, "unauthenticated", id="no-credential"),
    pytest.param({"Authorization": "Basic Zm9vOmJhcg=="}, 401, "unauthenticated", id="basic-auth"),
    pytest.param({"X-Vault-Token": "s.not-a-real-token"}, 401, "unknown_caller", id="garbage-token"),
    pytest.param({"Authorization": "Bearer hvs.nope"}, 401, "unknown_caller", id="garbage-bearer"),
    pytest.param({"X-Vault-Token": "x" * 5000}, 401, "unknown_caller", id="oversized-token"),
]


@pytest.mark.parametrize(("headers", "status", "code"), CALLER_REFUSALS)
def test_caller_refusals(broker: Broker, headers: dict[str, str], status: int, code: str) -> None:
    with broker.client() as client:
        response = client.post("/v1/runs", json={"grants": [SLACK]}, headers=headers)
    assert (response.status_code, response.json()["error"]) == (status, code)


def test_vault_token_without_runtime_mapping_is_unknown(broker: Broker) -> None:
    token = broker.vault.gateway_token("github")  # a real, valid Vault token of a non-runtime
    with broker.client(token) as client:
        response = client.post("/v1/runs", json={"grants": [SLACK]})
    assert (response.status_code, response.json()["error"]) == (401, "unknown_caller")


def test_bearer_header_authenticates_too(broker: Broker) -> None:
    token = broker.vault.runtime_token("notifier")
    with broker.client() as client:
        response = client.post("/v1/runs", json={"grants": [SLACK]},
                               headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 201


def test_admin_cannot_mint(broker: Broker) -> None:
    with broker.client(broker.vault.admin_token) as client:
        response = client.post("/v1/runs", json={"grants": [SLACK]})
    assert response.status_code in (401, 403)


@pytest.mark.anyio
async def test_end_run_stops_its_tokens(broker: Broker) -> None:
    bundle = broker.mint("notifier", [SLACK]).json()
    token, run_id = bundle["env"]["SLACK_BOT_TOKEN"], bundle["run_id"]
    async with broker.verifier("slack") as slack:
        await slack.verify(token)
        with broker.client(broker.vault.runtime_token("notifier")) as client:
            assert client.get(f"/v1/runs/{run_id}").json()["state"] == "active"
            ended = client.delete(f"/v1/runs/{run_id}")
            assert ended.status_code == 200
            assert ended.json()["state"] == "ended"
            assert client.delete(f"/v1/runs/{run_id}").status_code == 200  # idempotent
        with pytest.raises(TokenInvalid) as info:
            await slack.verify(token)
        assert (info.value.code, info.value.check) == ("invalid_token", "run")


def test_runs_are_private_to_their_runtime(broker: Broker) -> None:
    bundle = broker.mint("notifier", [SLACK]).json()
    with broker.client(broker.vault.runtime_token("coding-agent")) as other:
        assert other.get(f"/v1/runs/{bundle['run_id']}").json()["error"] == "not_found"
        assert other.delete(f"/v1/runs/{bundle['run_id']}").status_code == 404
    with broker.client(broker.vault.admin_token) as admin:
        record = admin.get(f"/v1/runs/{bundle['run_id']}").json()
        assert record["runtime"] == "notifier"
        assert admin.delete(f"/v1/runs/{bundle['run_id']}").json()["ended_by"].startswith("admin:")
    with broker.client(broker.vault.runtime_token("notifier")) as owner:
        assert owner.get("/v1/runs/run_doesnotexist").status_code == 404


def test_logs_carry_no_token(broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="valetkey")
    runtime_token = broker.vault.runtime_token("notifier")
    bundle = broker.mint("notifier", [SLACK]).json()
    with broker.client(runtime_token) as client:
        client.post("/v1/runs", json={"grants": [SLACK], "ttl": "99h"})
    text = caplog.text + json.dumps([r.__dict__ for r in caplog.records], default=str)
    assert "run_created" in text
    assert bundle["env"]["SLACK_BOT_TOKEN"] not in text
    assert bundle["env"]["SLACK_BOT_TOKEN"].split(".")[2] not in text
    assert runtime_token not in text


@pytest.mark.anyio
async def test_run_show_says_expired_until_purged(broker: Broker) -> None:
    bundle = broker.mint("notifier", [SLACK], ttl=1).json()
    await anyio.sleep(1.2)
    with broker.client(broker.vault.runtime_token("notifier")) as client:
        shown = client.get(f"/v1/runs/{bundle['run_id']}")
    assert (shown.status_code, shown.json()["state"]) == (200, "expired")
    async with broker.verifier("slack") as slack:  # within the exp leeway, the run check refuses
        with pytest.raises(TokenInvalid) as info:
            await slack.verify(bundle["env"]["SLACK_BOT_TOKEN"])
    assert (info.value.check, info.value.detail) == ("run", "token rejected: run has expired")


def test_run_show_says_revoked_by_whom_and_why(broker: Broker) -> None:
    run_id = broker.mint("notifier", [SLACK]).json()["run_id"]
    with broker.client(broker.vault.admin_token) as admin:
        assert admin.post("/v1/revocations", json={"scope": "run", "name": run_id,
                                                   "reason": "leaked in a log"}).status_code == 201
        shown = admin.get(f"/v1/runs/{run_id}").json()
    assert (shown["state"], shown["why"], shown["revoked_scope"]) == ("revoked", "leaked in a log", "run")
    assert shown["revoked_by"].startswith("admin:")


def test_run_ended_by_its_runtime_says_ended(broker: Broker) -> None:
    run_id = broker.mint("notifier", [SLACK]).json()["run_id"]
    with broker.client(broker.vault.runtime_token("notifier")) as client:
        client.delete(f"/v1/runs/{run_id}")
        shown = client.get(f"/v1/runs/{run_id}").json()
    assert shown["state"] == "ended"
    assert "revoked_by" not in shown


@pytest.mark.parametrize(("token", "status", "named"), [
    pytest.param("admin", 403, "this token is the security team's (admin policy), not a runtime's",
                 id="admin-token-creates-a-run"),
    pytest.param("gateway", 401, "caller is not a known runtime: this Vault token carries policies "
                 "['default', 'valetkey-gateway-github'], none of which identifies a runtime "
                 "(coding-agent: AppRole role 'valetkey-runtime-coding-agent'; notifier: policy "
                 "'valetkey-runtime-notifier') or the security team ('valetkey-admin')",
                 id="other-token-creates-a-run"),
])
def test_run_create_refusal_says_what_the_token_is(broker: Broker, token: str, status: int,
                                                   named: str) -> None:
    value = broker.vault.admin_token if token == "admin" else broker.vault.gateway_token("github")
    with broker.client(value) as client:
        response = client.post("/v1/runs", json={"grants": [SLACK]})
    assert response.status_code == status
    assert named in response.json()["detail"]


def test_runtime_token_on_admin_route_says_what_it_lacks(broker: Broker) -> None:
    with broker.client(broker.vault.runtime_token("notifier")) as client:
        response = client.get("/v1/revocations")
    assert (response.status_code, response.json()["error"]) == (403, "not_admin")
    detail = response.json()["detail"]
    assert detail.startswith("this token identifies runtime 'notifier', not the security team")
    assert "valetkey-admin" in detail


def test_unknown_upstream_lists_the_upstreams(broker: Broker) -> None:
    response = broker.mint("coding-agent", [_grant("gitlab", "read")])
    assert response.json()["error"] == "unknown_audience"
    assert response.json()["detail"] == (
        "grants[0]: no upstream 'gitlab' in policy; upstreams: ['anthropic', 'github', 'github-git', "
        "'openai', 'slack'], destinations: ['github-codeload', 'pypi', 'python-docs', 'pythonhosted'] "
        "(runtime coding-agent may use ['anthropic', 'github', 'github-codeload', 'github-git', 'openai', "
        "'pypi', 'python-docs', 'pythonhosted'])")
