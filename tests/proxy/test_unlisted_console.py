"""A request to an unlisted host, held at the egress proxy, approved in the security console.

Debian's headless Chromium (Playwright, as tests/broker/test_console_browser.py): the held request
shows its host in the approvals table and on its page, is approved there, and reaches the host
once. Screenshots go under the test's output directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from playwright.sync_api import Page

from tests.broker.test_console_browser import browser, console_broker, page, sign_in  # noqa: F401 - fixtures
from tests.gateways.test_approvals import pending_of
from tests.proxy.conftest import ASK, ISSUER, ProxyStack
from tests.proxy.test_unlisted import URLS, post, seen

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def console(proxy_stack: ProxyStack) -> Iterator[str]:
    with console_broker(proxy_stack.vault, proxy_stack.redis_url, ISSUER, proxy_stack.policies) as url:
        yield url


def test_a_held_request_to_an_unlisted_host_is_approved_in_the_console(
        proxy_stack: ProxyStack, console: str, page: Page, tmp_path: Path) -> None:  # noqa: F811
    shots = tmp_path / "screenshots"
    shots.mkdir()
    admin = proxy_stack.vault.admin_token
    sign_in(page, console, admin)
    page.wait_for_url(f"{console}/console")
    before = seen(proxy_stack, "https")
    with ThreadPoolExecutor(1) as pool:
        # minting runs its own event loop: not on this thread, where Playwright's runs
        run, _, token = pool.submit(proxy_stack.mint, ["secure/read_items"], runtime="asker").result()
        held = post(proxy_stack, pool, token, URLS["https"])
        (approval,) = pending_of(console, admin, run)
        row = page.locator(f"tr[data-approval='{approval['id']}']")
        row.wait_for()
        assert f"unlisted host {ASK}" in row.inner_text()
        page.screenshot(path=str(shots / "01-overview-unlisted-held.png"), full_page=True)
        page.goto(f"{console}/console/approvals/{approval['id']}")
        assert ASK in page.inner_text("dd.unlisted")
        assert "deploy finished" in page.inner_text("pre.preview")
        page.screenshot(path=str(shots / "02-unlisted-approval.png"), full_page=True)
        page.click("button.approve")
        page.wait_for_url("**/console/approvals?done=approved")
        response = held.result(timeout=15)
    assert response.status_code == 200, response.text
    assert seen(proxy_stack, "https") == before + 1
