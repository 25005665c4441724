"""``valetkey approvals list|show|approve|deny`` against the real gateway stack."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from click.testing import CliRunner

from tests.gateways.test_approvals import PUBLISH, pending_of, send
from tests.support.gateway_stack import Stack
from valetkey.cli import main


def run(stack: Stack, token: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, [*args, "--broker", stack.broker_url], env={"VAULT_TOKEN": token})
    return result.exit_code, result.output


@pytest.mark.parametrize(("verb", "said_word", "status"), [
    pytest.param("approve", "approved", 200, id="approve"), pytest.param("deny", "denied", 403, id="deny")])
def test_list_show_and_decide(gateway_stack: Stack, verb: str, said_word: str, status: int) -> None:
    bundle = gateway_stack.mint([PUBLISH])
    admin = gateway_stack.vault.admin_token
    with ThreadPoolExecutor(1) as pool:
        held = send(pool, gateway_stack.url("echo"), bundle["env"]["ECHO_TOKEN"])
        (approval,) = pending_of(gateway_stack.broker_url, admin, bundle["run_id"])
        code, listed = run(gateway_stack, admin, "approvals", "list")
        assert code == 0
        assert approval["id"] in listed
        code, shown = run(gateway_stack, admin, "approvals", "show", approval["id"])
        assert code == 0
        assert approval["digest"] in shown
        assert "ship it" in shown
        extra = ["--yes"] if verb == "approve" else []
        code, said = run(gateway_stack, admin, "approvals", verb, approval["id"], "--reason", "cli", *extra)
        assert code == 0, said
        assert f"{said_word} {approval['id']}" in said
        assert held.result(timeout=15).status_code == status
    code, again = run(gateway_stack, admin, "approvals", verb, approval["id"], *extra)
    assert code == 1
    assert "approval_not_pending" in again


def test_a_runtime_token_is_not_an_approver(gateway_stack: Stack) -> None:
    code, said = run(gateway_stack, gateway_stack.vault.runtime_token("tester"), "approvals", "list")
    assert code == 1
    assert "403 not_approver" in said
