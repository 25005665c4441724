"""The console without a browser: cookies, headers, CSRF, who sees what, sessions across brokers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from broker.app import create_app
from broker.console_auth import CSP
from broker.settings import BrokerSettings
from tests.gateways.test_approvals import PUBLISH, pending_of, send
from tests.support.gateway_stack import ISSUER, Stack
from tests.support.servers import ThreadedServer

SESSION = "__Host-valetkey_session"


@pytest.fixture(scope="module")
def other_broker(gateway_stack: Stack) -> Iterator[str]:
    settings = BrokerSettings.from_env({
        "VAULT_ADDR": gateway_stack.vault.addr, "VAULT_TOKEN": gateway_stack.vault.broker_token,
        "VALETKEY_REDIS_URL": gateway_stack.redis_url, "VALETKEY_ISSUER": ISSUER})
    with ThreadedServer(create_app(settings, gateway_stack.policies)) as server:
        yield server.url


def cookie(response: httpx.Response, name: str) -> tuple[str, str]:
    """(value, the whole Set-Cookie line) of cookie ``name``."""
    for line in response.headers.get_list("set-cookie"):
        if line.startswith(f"{name}="):
            return line.split(";", 1)[0].split("=", 1)[1], line
    raise AssertionError(f"no cookie {name}: {response.headers.get_list('set-cookie')}")


def sign_in(broker: str, **form: str) -> httpx.Response:
    page = httpx.get(f"{broker}/console/login")
    login, _ = cookie(page, "valetkey_login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    return httpx.post(f"{broker}/console/login", data={"csrf": csrf.group(1), **form},
                      headers={"cookie": f"valetkey_login={login}", "origin": broker})


def session_of(broker: str, token: str) -> tuple[str, str]:
    """(session cookie value, its CSRF token) after signing in with ``token``."""
    answer = sign_in(broker, token=token)
    assert answer.status_code == 303, answer.text
    value, _ = cookie(answer, SESSION)
    page = httpx.get(f"{broker}/console/approvals", headers={"cookie": f"{SESSION}={value}"})
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    return value, csrf.group(1)


def test_pages_carry_strict_headers_and_cookies(gateway_stack: Stack) -> None:
    page = httpx.get(f"{gateway_stack.broker_url}/console/login")
    assert page.headers["content-security-policy"] == CSP
    assert "'unsafe-inline'" not in CSP
    assert "<script>" not in page.text  # the one script is a file: script-src 'self'
    assert (page.headers["x-frame-options"], page.headers["cache-control"]) == ("DENY", "no-store")
    answer = sign_in(gateway_stack.broker_url, token=gateway_stack.vault.admin_token)
    assert (answer.status_code, answer.headers["location"]) == (303, "/console")
    _, line = cookie(answer, SESSION)
    assert {"HttpOnly", "Secure", "SameSite=strict", "Path=/"} <= {p.strip() for p in line.split(";")}
    assert gateway_stack.vault.admin_token not in str(answer.headers)


@pytest.mark.parametrize(("form", "headers", "error"), [
    pytest.param({"csrf": "wrong"}, {}, "csrf_failed", id="wrong-csrf"),
    pytest.param({}, {}, "csrf_failed", id="no-csrf"),
    pytest.param(None, {"origin": "https://evil.example"}, "csrf_failed", id="other-origin"),
    pytest.param(None, {"sec-fetch-site": "cross-site"}, "csrf_failed", id="cross-site"),
])
def test_forms_without_their_csrf_token_are_refused(gateway_stack: Stack, form: dict[str, str] | None,
                                                    headers: dict[str, str], error: str) -> None:
    broker = gateway_stack.broker_url
    value, csrf = session_of(broker, gateway_stack.vault.admin_token)
    body = {"scope": "all", "reason": "forged", **(form if form is not None else {"csrf": csrf})}
    answer = httpx.post(f"{broker}/console/revoke", data=body,
                        headers={"cookie": f"{SESSION}={value}", **headers})
    assert answer.status_code == 403
    assert error in answer.text
    listed = httpx.get(f"{broker}/v1/revocations", headers={"X-Vault-Token": gateway_stack.vault.admin_token})
    assert all(r["scope"] != "all" for r in listed.json()["revocations"])


@pytest.mark.parametrize(("who", "lands"), [
    pytest.param("admin", "/console", id="admin"),
    pytest.param("approver", "/console/approvals", id="approver"),
    pytest.param("runtime", "/console/login?error=not_approver", id="runtime"),
])
def test_who_may_sign_in(gateway_stack: Stack, who: str, lands: str) -> None:
    vault = gateway_stack.vault
    token = {"admin": vault.admin_token, "approver": vault.approver_token("testers"),
             "runtime": vault.runtime_token("tester")}[who]
    answer = sign_in(gateway_stack.broker_url, token=token)
    assert (answer.status_code, answer.headers["location"]) == (303, lands)


def test_an_approver_sees_only_its_approvals_across_brokers_and_reloads(
        gateway_stack: Stack, other_broker: str) -> None:
    value, csrf = session_of(gateway_stack.broker_url, gateway_stack.vault.approver_token("testers"))
    jar = {"cookie": f"{SESSION}={value}"}
    bundle = gateway_stack.mint([PUBLISH])
    with ThreadPoolExecutor(1) as pool:
        held = send(pool, gateway_stack.url("echo"), bundle["env"]["ECHO_TOKEN"])
        (approval,) = pending_of(gateway_stack.broker_url, gateway_stack.vault.admin_token, bundle["run_id"])
        for _ in range(2):  # the page reloaded, at either broker: the same request is there
            for broker in (gateway_stack.broker_url, other_broker):
                assert approval["id"] in httpx.get(f"{broker}/console/approvals", headers=jar).text
        assert httpx.get(f"{other_broker}/console", headers=jar).headers["location"] == "/console/approvals"
        assert httpx.get(f"{other_broker}/console/revocations", headers=jar).status_code == 403
        refused = httpx.post(f"{other_broker}/console/revoke", headers=jar,
                             data={"csrf": csrf, "scope": "run", "name": bundle["run_id"], "reason": "x"})
        assert refused.status_code == 403
        assert "not_admin" in refused.text
        decided = httpx.post(f"{other_broker}/console/approvals/{approval['id']}/approve", headers=jar,
                             data={"csrf": csrf, "digest": approval["digest"]})
        assert decided.status_code == 303
        assert held.result(timeout=15).status_code == 200


def test_sign_in_code_is_single_use_and_logout_ends_the_session(gateway_stack: Stack) -> None:
    broker = gateway_stack.broker_url
    made = httpx.post(f"{broker}/v1/console/sign-in-codes", headers={"X-Vault-Token": gateway_stack.vault.admin_token})
    code = made.json()["path"].split("code=", 1)[1]
    first = sign_in(broker, code=code)
    assert first.headers["location"] == "/console"
    assert sign_in(broker, code=code).headers["location"] == "/console/login?error=unknown_caller"
    value, _ = cookie(first, SESSION)
    jar = {"cookie": f"{SESSION}={value}"}
    page = httpx.get(f"{broker}/console", headers=jar)
    assert page.status_code == 200
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    httpx.post(f"{broker}/console/logout", headers=jar, data={"csrf": csrf.group(1)})
    assert httpx.get(f"{broker}/console", headers=jar).headers["location"] == "/console/login"
    runtime = httpx.post(f"{broker}/v1/console/sign-in-codes",
                         headers={"X-Vault-Token": gateway_stack.vault.runtime_token("tester")})
    assert (runtime.status_code, runtime.json()["error"]) == (403, "not_admin")


def test_the_audit_stream_is_live_for_admins_only(gateway_stack: Stack) -> None:
    broker = gateway_stack.broker_url
    value, _ = session_of(broker, gateway_stack.vault.admin_token)
    with ThreadPoolExecutor(1) as pool, httpx.stream(
            "GET", f"{broker}/console/audit/stream", headers={"cookie": f"{SESSION}={value}"},
            timeout=10) as events:
        assert events.headers["content-type"].startswith("text/event-stream")
        minted = pool.submit(gateway_stack.mint, [PUBLISH])
        run = minted.result(timeout=10)["run_id"]
        seen = ""
        for line in events.iter_lines():
            seen += line + "\n"
            if line.startswith("data:") and run in line and "run_created" in line:
                break
    assert f'"run": "{run}"' in seen
    approver, _ = session_of(broker, gateway_stack.vault.approver_token("testers"))
    refused = httpx.get(f"{broker}/console/audit/stream", headers={"cookie": f"{SESSION}={approver}"})
    assert refused.status_code == 403
    assert refused.json()["error"] == "not_admin"
