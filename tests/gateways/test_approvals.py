"""Requests held for a person at the gateway: approve, deny, timeout, revoke, caps, replicas.

Against the real gateway stack (OpenBao, redis-server, broker, echo upstream): a request of a
purpose with ``approval: required`` waits at the gateway with nothing sent upstream until a
decision is recorded through a broker, any broker, for that request's digest.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis

from broker.app import create_app
from broker.settings import BrokerSettings
from contract import keys
from contract.secret import Secret
from gateways.detectors import verify_signature
from tests.gateways.test_revocation_watcher import WEBHOOK_SECRET, Receiver
from tests.support.gateway_stack import ISSUER, Stack, audit_line, start_gateway
from tests.support.servers import ThreadedServer

PUBLISH = {"upstream": "echo", "purpose": "publish"}
FAST = {"upstream": "echo", "purpose": "publish_fast"}
READ = {"upstream": "echo", "purpose": "read_items"}
BODY = b'{"title": "release 1.2", "notes": "ship it"}'


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(8) as executor:
        yield executor


@pytest.fixture(scope="module")
def second_broker(gateway_stack: Stack) -> Iterator[str]:
    """Another broker over the same Redis and Vault: decisions recorded there reach every gateway."""
    settings = BrokerSettings.from_env({
        "VAULT_ADDR": gateway_stack.vault.addr, "VAULT_TOKEN": gateway_stack.vault.broker_token,
        "VALETKEY_REDIS_URL": gateway_stack.redis_url,
        "VALETKEY_ISSUER": ISSUER})
    with ThreadedServer(create_app(settings, gateway_stack.policies)) as server:
        yield server.url


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    with ThreadedServer(found) as server:
        found.url = f"{server.url}/hook"
        yield found


@pytest.fixture(scope="module")
def replica(gateway_stack: Stack, receiver: Receiver) -> Iterator[str]:
    """A second gateway for the same upstream, capped at one waiting request per run, with a
    signed webhook that links the console."""
    server = start_gateway(gateway_stack, "echo", VALETKEY_APPROVAL_PER_RUN="1",
                           VALETKEY_ALERT_WEBHOOK_URL=receiver.url, VALETKEY_ALERT_WEBHOOK_SECRET=WEBHOOK_SECRET,
                           VALETKEY_CONSOLE_URL="https://valetkey.example/")
    yield server.url
    server.stop()


def send(pool: ThreadPoolExecutor, url: str, token: str, path: str = "/v1/publish",
         body: bytes = BODY) -> Future[httpx.Response]:
    return pool.submit(httpx.post, f"{url}{path}", content=body, timeout=30.0,
                       headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})


def pending_of(broker: str, token: str, run: str, count: int = 1) -> list[dict[str, Any]]:
    for _ in range(200):
        answer = httpx.get(f"{broker}/v1/approvals", headers={"X-Vault-Token": token})
        answer.raise_for_status()
        found = [a for a in answer.json()["approvals"] if a["run"] == run]
        if len(found) >= count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"no pending approval of run {run}")


def decide(broker: str, token: str, approval: dict[str, Any], verb: str, **body: str) -> httpx.Response:
    return httpx.post(f"{broker}/v1/approvals/{approval['id']}/{verb}", json=body,
                      headers={"X-Vault-Token": token})


def requests_seen(stack: Stack, path: str) -> int:
    return sum(1 for s in stack.upstreams["echo"].seen if s.path == path)


def test_an_approved_request_goes_upstream_once_with_the_real_secret(
        gateway_stack: Stack, pool: ThreadPoolExecutor) -> None:
    bundle = gateway_stack.mint([PUBLISH])
    admin = gateway_stack.vault.admin_token
    before = requests_seen(gateway_stack, "/v1/publish")
    held = send(pool, gateway_stack.url("echo"), bundle["env"]["ECHO_TOKEN"])
    (approval,) = pending_of(gateway_stack.broker_url, admin, bundle["run_id"])

    assert not held.done()
    assert requests_seen(gateway_stack, "/v1/publish") == before
    assert approval["digest"] == hashlib.sha256(b"echo\nPOST\n/v1/publish\n" + BODY).hexdigest()
    assert (approval["method"], approval["path"], approval["purpose"]) == ("POST", "/v1/publish", "publish")
    assert "ship it" in approval["preview"]
    assert bundle["env"]["ECHO_TOKEN"] not in json.dumps(approval)
    answer = decide(gateway_stack.broker_url, admin, approval, "approve", digest=approval["digest"])
    assert answer.status_code == 200, answer.text
    response = held.result(timeout=15)

    assert response.status_code == 200, response.text
    seen = [s for s in gateway_stack.upstreams["echo"].seen if s.path == "/v1/publish"][before:]
    assert len(seen) == 1
    assert seen[0].body == BODY
    assert seen[0].header("authorization") == [f"Bearer {gateway_stack.vault.secrets['echo']}"]
    line = audit_line(gateway_stack, response.headers["x-valetkey-request-id"])
    assert (line["reason"], line["approval"], line["approved_by"]) == ("ok", approval["id"],
                                                                       answer.json()["decided_by"])
    # single-use: the decision cannot be made again, nor carried to a retry
    again = decide(gateway_stack.broker_url, admin, approval, "approve", digest=approval["digest"])
    assert (again.status_code, again.json()["error"]) == (409, "approval_not_pending")
    retry = send(pool, gateway_stack.url("echo"), bundle["env"]["ECHO_TOKEN"])
    (second,) = pending_of(gateway_stack.broker_url, admin, bundle["run_id"])
    assert second["id"] != approval["id"]
    assert not retry.done()
    decide(gateway_stack.broker_url, admin, second, "deny", reason="once was enough")
    assert retry.result(timeout=15).json()["error"] == "approval_denied"


@pytest.mark.parametrize(("verb", "body", "status", "error"), [
    pytest.param("approve", {"digest": "0" * 64}, 409, "approval_digest_mismatch", id="other-digest"),
    pytest.param("approve", {}, 400, "invalid_request", id="no-digest"),
    pytest.param("approve", {"digest": "x", "extra": "1"}, 400, "invalid_request", id="unknown-member"),
])
def test_a_decision_must_name_the_request_shown(gateway_stack: Stack, pool: ThreadPoolExecutor, verb: str,
                                                body: dict[str, str], status: int, error: str) -> None:
    bundle = gateway_stack.mint([PUBLISH])
    admin = gateway_stack.vault.admin_token
    held = send(pool, gateway_stack.url("echo"), bundle["env"]["ECHO_TOKEN"])
    (approval,) = pending_of(gateway_stack.broker_url, admin, bundle["run_id"])
    answer = decide(gateway_stack.broker_url, admin, approval, verb, **body)
    assert (answer.status_code, answer.json()["error"]) == (status, error)
    assert not held.done()
    decide(gateway_stack.broker_url, admin, approval, "deny")
    response = held.result(timeout=15)
    assert (response.status_code, response.json()["error"]) == (403, "approval_denied")


def test_a_run_token_in_the_body_is_never_held(gateway_stack: Stack, pool: ThreadPoolExecutor) -> None:
    """A run token that would leave with the request is refused before anyone is asked, so it is
    in no preview (gateways/run_tokens.py runs before hold_for_approval)."""
    bundle = gateway_stack.mint([PUBLISH])
    token = bundle["env"]["ECHO_TOKEN"]
    response = send(pool, gateway_stack.url("echo"), token, body=b'{"note": "' + token.encode() + b'"}').result(
        timeout=15)
    assert (response.status_code, response.json()["error"]) == (403, "credential_passthrough")
    listed = httpx.get(f"{gateway_stack.broker_url}/v1/approvals",
                       headers={"X-Vault-Token": gateway_stack.vault.admin_token}).json()["approvals"]
    assert [a for a in listed if a["run"] == bundle["run_id"]] == []


def test_denied_request_never_reaches_the_upstream(gateway_stack: Stack, pool: ThreadPoolExecutor) -> None:
    bundle = gateway_stack.mint([PUBLISH])
    admin = gateway_stack.vault.admin_token
    before = gateway_stack.upstreams["echo"].connections
    held = send(pool, gateway_stack.url("echo"), bundle["env"]["ECHO_TOKEN"])
    (approval,) = pending_of(gateway_stack.broker_url, admin, bundle["run_id"])
    decide(gateway_stack.broker_url, admin, approval, "deny", reason="not today")
    response = held.result(timeout=15)

    assert (response.status_code, response.json()["error"]) == (403, "approval_denied")
    assert "not today" in response.json()["detail"]
    assert gateway_stack.upstreams["echo"].connections == before
    shown = httpx.get(f"{gateway_stack.broker_url}/v1/approvals/{approval['id']}",
                      headers={"X-Vault-Token": admin}).json()
    assert (shown["state"], shown["why"]) == ("denied", "not today")
    assert shown["decided_by"].startswith("admin:")


def test_nobody_decides_approval_timeout(gateway_stack: Stack) -> None:
    bundle = gateway_stack.mint([FAST])
    started = time.monotonic()
    response = httpx.post(f"{gateway_stack.url('echo')}/v1/publish-fast", content=b"{}", timeout=30,
                          headers={"Authorization": f"Bearer {bundle['env']['ECHO_TOKEN']}"})
    waited = time.monotonic() - started

    assert (response.status_code, response.json()["error"]) == (403, "approval_timeout")
    assert 1.9 <= waited < 8
    line = audit_line(gateway_stack, response.headers["x-valetkey-request-id"])
    assert line["reason"] == "approval_timeout"
    assert line["approval"].startswith("apr_")


def test_revoking_the_run_cancels_its_waiting_request(gateway_stack: Stack, pool: ThreadPoolExecutor) -> None:
    bundle = gateway_stack.mint([PUBLISH])
    admin = gateway_stack.vault.admin_token
    held = send(pool, gateway_stack.url("echo"), bundle["env"]["ECHO_TOKEN"])
    (approval,) = pending_of(gateway_stack.broker_url, admin, bundle["run_id"])
    httpx.post(f"{gateway_stack.broker_url}/v1/revocations", headers={"X-Vault-Token": admin},
               json={"scope": "run", "name": bundle["run_id"], "reason": "stop"}).raise_for_status()
    response = held.result(timeout=15)

    assert (response.status_code, response.json()["error"]) == (401, "token_revoked")
    shown = httpx.get(f"{gateway_stack.broker_url}/v1/approvals/{approval['id']}",
                      headers={"X-Vault-Token": admin}).json()
    assert shown["state"] == "cancelled"
    late = decide(gateway_stack.broker_url, admin, approval, "approve", digest=approval["digest"])
    assert (late.status_code, late.json()["error"]) == (409, "approval_not_pending")


def test_replicas_and_brokers_share_approvals_and_the_cap(
        gateway_stack: Stack, pool: ThreadPoolExecutor, replica: str, second_broker: str) -> None:
    """Held at one replica, decided at the other broker; the per-run cap counts every replica."""
    bundle = gateway_stack.mint([PUBLISH])
    admin, token = gateway_stack.vault.admin_token, bundle["env"]["ECHO_TOKEN"]
    first = send(pool, gateway_stack.url("echo"), token)  # held at the first replica
    (approval,) = pending_of(gateway_stack.broker_url, admin, bundle["run_id"])
    full = send(pool, replica, token).result(timeout=15)  # the second replica counts it
    assert (full.status_code, full.json()["error"]) == (429, "approval_queue_full")
    assert decide(second_broker, admin, approval, "approve", digest=approval["digest"]).status_code == 200
    assert first.result(timeout=15).status_code == 200

    second = send(pool, replica, token)  # held at the second replica, decided at the first broker
    (approval,) = pending_of(second_broker, admin, bundle["run_id"])
    assert decide(gateway_stack.broker_url, admin, approval, "approve", digest=approval["digest"]).status_code == 200
    assert second.result(timeout=15).status_code == 200


def test_the_webhook_is_told_with_a_console_link_and_no_secret(
        gateway_stack: Stack, pool: ThreadPoolExecutor, replica: str, receiver: Receiver) -> None:
    bundle = gateway_stack.mint([PUBLISH])
    admin = gateway_stack.vault.admin_token
    held = send(pool, replica, bundle["env"]["ECHO_TOKEN"])
    (approval,) = pending_of(gateway_stack.broker_url, admin, bundle["run_id"])
    for _ in range(100):
        notices = [(h, b) for h, b in list(receiver.posts) if approval["id"].encode() in b]
        if notices:
            break
        time.sleep(0.05)
    decide(gateway_stack.broker_url, admin, approval, "deny")
    held.result(timeout=15)
    ((headers, body),) = notices
    assert verify_signature(Secret(WEBHOOK_SECRET), body, headers["x-valetkey-signature"])
    assert headers["x-valetkey-event"] == "approval_requested"
    notice = json.loads(body)
    assert notice["console_url"] == f"https://valetkey.example/console/approvals/{approval['id']}"
    assert (notice["digest"], notice["run"]) == (approval["digest"], bundle["run_id"])
    assert bundle["env"]["ECHO_TOKEN"] not in body.decode()
    assert "ship it" not in body.decode()  # no body preview leaves for the webhook
    assert gateway_stack.vault.secrets["echo"] not in body.decode()


def test_a_client_that_hangs_up_cancels_its_approval(gateway_stack: Stack) -> None:
    bundle = gateway_stack.mint([PUBLISH])
    admin = gateway_stack.vault.admin_token
    host, port = gateway_stack.url("echo").removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/publish HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                     + bundle["env"]["ECHO_TOKEN"].encode() + b"\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(BODY)}\r\n\r\n".encode() + BODY)
        (approval,) = pending_of(gateway_stack.broker_url, admin, bundle["run_id"])
    for _ in range(100):
        shown = httpx.get(f"{gateway_stack.broker_url}/v1/approvals/{approval['id']}",
                          headers={"X-Vault-Token": admin}).json()
        if shown["state"] != "pending":
            break
        time.sleep(0.05)
    assert (shown["state"], shown["decided_by"]) == ("cancelled", "client disconnected")


def test_enterprise_deny_list_is_never_asked(gateway_stack: Stack) -> None:
    bundle = gateway_stack.mint([PUBLISH])
    response = httpx.post(f"{gateway_stack.url('echo')}/v1/publish/forbidden", content=b"{}",
                          headers={"Authorization": f"Bearer {bundle['env']['ECHO_TOKEN']}"})
    assert (response.status_code, response.json()["error"]) == (403, "enterprise_denied")
    listed = httpx.get(f"{gateway_stack.broker_url}/v1/approvals",
                       headers={"X-Vault-Token": gateway_stack.vault.admin_token}).json()["approvals"]
    assert all(a["run"] != bundle["run_id"] for a in listed)


def test_approver_groups_see_and_decide_only_their_own(gateway_stack: Stack, pool: ThreadPoolExecutor) -> None:
    bundle = gateway_stack.mint([PUBLISH, FAST])
    admin, tester = gateway_stack.vault.admin_token, gateway_stack.vault.approver_token("testers")
    token = bundle["env"]["ECHO_TOKEN"]
    mine = send(pool, gateway_stack.url("echo"), token)
    theirs = send(pool, gateway_stack.url("echo"), token, "/v1/publish-fast", b"{}")
    everything = pending_of(gateway_stack.broker_url, admin, bundle["run_id"], count=2)
    (visible,) = pending_of(gateway_stack.broker_url, tester, bundle["run_id"])
    other = next(a for a in everything if a["id"] != visible["id"])

    assert visible["purpose"] == "publish"
    assert other["purpose"] == "publish_fast"
    refused = decide(gateway_stack.broker_url, tester, other, "approve", digest=other["digest"])
    assert (refused.status_code, refused.json()["error"]) == (404, "approval_not_found")
    runtime = decide(gateway_stack.broker_url, gateway_stack.vault.runtime_token("tester"), visible, "deny")
    assert (runtime.status_code, runtime.json()["error"]) == (403, "not_approver")
    answer = decide(gateway_stack.broker_url, tester, visible, "approve", digest=visible["digest"])
    assert answer.json()["decided_by"].startswith("approver:")
    assert mine.result(timeout=15).status_code == 200
    assert theirs.result(timeout=15).json()["error"] == "approval_timeout"


def test_a_decision_whose_announcement_is_lost_is_found_by_polling(
        gateway_stack: Stack, pool: ThreadPoolExecutor) -> None:
    """The channel only wakes the holder; the record is the truth (a decision written while a
    gateway's subscription was reconnecting is still found, within the poll's backoff)."""
    bundle = gateway_stack.mint([PUBLISH])
    held = send(pool, gateway_stack.url("echo"), bundle["env"]["ECHO_TOKEN"])
    (approval,) = pending_of(gateway_stack.broker_url, gateway_stack.vault.admin_token, bundle["run_id"])
    client = redis.Redis.from_url(gateway_stack.redis_url)
    try:  # what the broker's script does, without its PUBLISH
        client.hset(f"{keys.APPROVAL_PREFIX}{approval['id']}", mapping={"state": "denied", "decided_by": "test"})
    finally:
        client.close()
    started = time.monotonic()
    response = held.result(timeout=15)
    assert (response.status_code, response.json()["error"]) == (403, "approval_denied")
    assert time.monotonic() - started < 6  # the poll backs off to 5 s at most
