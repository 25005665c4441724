"""The security console in a real browser: Debian's headless Chromium driven by Playwright.

Against the real gateway stack: sign in with the admin's Vault token, watch a held request appear,
approve it (the sandbox's request completes, the upstream gets the real secret once), deny another
(``approval_denied``), revoke a run from the page (its next request is refused). Screenshots of
each page go to the test's output directory (``tmp_path``; ``--basetemp`` to keep them).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from broker.app import create_app
from broker.settings import BrokerSettings
from policies.model import PolicySet
from tests.gateways.test_approvals import BODY, PUBLISH, READ, pending_of, send
from tests.support.gateway_stack import ISSUER, Stack
from tests.support.servers import ThreadedServer
from valetkey.dev.vault_seed import DevVault

CHROMIUM = "/usr/bin/chromium"  # Debian's package (scripts/test installs it); never downloaded
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
pytestmark = pytest.mark.slow


@contextmanager
def console_broker(vault: DevVault, redis_url: str, issuer: str, policies: PolicySet) -> Iterator[str]:
    """A broker as `valetkey dev` runs it (plain HTTP, so its cookies cannot be Secure) over a
    stack's Redis and Vault: the gateways and the stack's own broker see what it records."""
    settings = BrokerSettings.from_env({
        "VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.broker_token, "VALETKEY_REDIS_URL": redis_url,
        "VALETKEY_ISSUER": issuer, "VALETKEY_CONSOLE_INSECURE_COOKIES": "1"})
    with ThreadedServer(create_app(settings, policies)) as server:
        yield server.url


@pytest.fixture(scope="module")
def console(gateway_stack: Stack) -> Iterator[str]:
    with console_broker(gateway_stack.vault, gateway_stack.redis_url, ISSUER, gateway_stack.policies) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(15_000)
    yield context.new_page()
    context.close()


def sign_in(page: Page, console: str, token: str, shots: Path | None = None) -> None:
    page.goto(f"{console}/console/login")
    if shots is not None:
        page.screenshot(path=str(shots / "01-login.png"), full_page=True)
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")


def test_approve_deny_and_revoke_from_the_console(gateway_stack: Stack, console: str, page: Page,
                                                  tmp_path: Path) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    admin = gateway_stack.vault.admin_token
    sign_in(page, console, admin, shots)
    page.wait_for_url(f"{console}/console")
    assert page.context.cookies()[0]["httpOnly"]
    assert admin not in str(page.context.cookies()) + page.content()  # the token is not kept

    # a held request appears on the page by itself (console.js refreshes the table)
    bundle = gateway_stack.mint([PUBLISH, READ])
    token = bundle["env"]["ECHO_TOKEN"]
    before = [s for s in gateway_stack.upstreams["echo"].seen if s.path == "/v1/publish"]
    with ThreadPoolExecutor(2) as pool:
        held = send(pool, gateway_stack.url("echo"), token)
        (approval,) = pending_of(console, admin, bundle["run_id"])
        row = page.locator(f"tr[data-approval='{approval['id']}']")
        row.wait_for()
        page.screenshot(path=str(shots / "02-overview-held.png"), full_page=True)
        page.goto(f"{console}/console/approvals/{approval['id']}")
        assert "ship it" in page.inner_text("pre.preview")
        assert approval["digest"] in page.content()
        page.screenshot(path=str(shots / "03-approval.png"), full_page=True)
        page.click("button.approve")
        page.wait_for_url("**/console/approvals?done=approved")
        response = held.result(timeout=15)
    assert response.status_code == 200
    seen = [s for s in gateway_stack.upstreams["echo"].seen if s.path == "/v1/publish"][len(before):]
    assert len(seen) == 1
    assert seen[0].body == BODY
    assert seen[0].header("authorization") == [f"Bearer {gateway_stack.vault.secrets['echo']}"]

    # deny another from the list page, after a reload of the page (the record is in Redis)
    with ThreadPoolExecutor(1) as pool:
        held = send(pool, gateway_stack.url("echo"), token)
        (second,) = pending_of(console, admin, bundle["run_id"])
        page.goto(f"{console}/console/approvals")
        page.reload()
        row = page.locator(f"tr[data-approval='{second['id']}']")
        row.locator("input[name=reason]").fill("not this one")
        page.screenshot(path=str(shots / "04-approvals.png"), full_page=True)
        row.locator("button.deny").click()
        page.wait_for_url("**/console/approvals?done=denied")
        denied = held.result(timeout=15)
    assert (denied.status_code, denied.json()["error"]) == (403, "approval_denied")

    # revoke the run from the overview: its next request is refused
    page.goto(f"{console}/console")
    run_row = page.locator(f"tr[data-run='{bundle['run_id']}']")
    form = run_row.locator("form.revoke").first
    form.locator("input[name=reason]").fill("seen enough")
    form.locator("button").click()
    page.wait_for_url("**/console?done=revoked")
    refused = httpx.get(f"{gateway_stack.url('echo')}/v1/items",
                        headers={"Authorization": f"Bearer {token}"})
    for _ in range(50):
        if refused.status_code == 401:
            break
        time.sleep(0.05)
        refused = httpx.get(f"{gateway_stack.url('echo')}/v1/items", headers={"Authorization": f"Bearer {token}"})
    assert (refused.status_code, refused.json()["error"]) == (401, "token_revoked")
    page.goto(f"{console}/console/revocations")
    assert "seen enough" in page.inner_text("table.revocations")
    page.screenshot(path=str(shots / "05-revocations.png"), full_page=True)
    page.goto(f"{console}/console/audit")
    page.locator("#audit-live tr").first.wait_for()
    page.screenshot(path=str(shots / "06-audit.png"), full_page=True)
    assert len(list(shots.glob("*.png"))) == 6


def test_a_non_admin_token_and_a_csrf_less_post_are_refused(gateway_stack: Stack, console: str,
                                                            page: Page, tmp_path: Path) -> None:
    sign_in(page, console, gateway_stack.vault.runtime_token("tester"))
    page.wait_for_url("**/console/login?error=*")
    assert "not_approver" in page.inner_text(".error")
    page.screenshot(path=str(tmp_path / "refused-runtime.png"), full_page=True)

    sign_in(page, console, gateway_stack.vault.admin_token)
    page.wait_for_url(f"{console}/console")
    # a form posted without the CSRF token, from the signed-in page itself
    answer = page.evaluate("""async () => {
        const r = await fetch('/console/revoke', {method: 'POST', credentials: 'same-origin',
            headers: {'content-type': 'application/x-www-form-urlencoded'},
            body: 'scope=all&reason=csrf'});
        return [r.status, await r.text()];
    }""")
    assert answer[0] == 403
    assert "csrf_failed" in answer[1]
    revoked = httpx.get(f"{console}/v1/revocations", headers={"X-Vault-Token": gateway_stack.vault.admin_token})
    assert all(r["scope"] != "all" for r in revoked.json()["revocations"])
