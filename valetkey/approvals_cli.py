"""``valetkey approvals list|show|approve|deny``: decide requests held at a gateway.

Through the broker API with the caller's Vault token: the security team's (admin policy) sees
every approval, an approver group member's only its group's. ``approve`` first shows the held
request (method, path, digest, redacted preview) and sends the digest it showed, so the decision
is bound to exactly those bytes; ``--yes`` skips the confirmation, never the binding.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click

from valetkey.cli_support import BROKER_OPTION, CONTEXT, JSON_OPTION, broker_client, fail, show

REASON_OPTION = click.option("--reason", default="", metavar="TEXT",
                             help="Why (recorded in the audit stream).")


@click.group("approvals", context_settings=CONTEXT)
def approvals_group() -> None:
    """Requests waiting for a person at a gateway (purposes with `approval: required`)."""


def _describe(a: dict[str, Any]) -> str:
    left = max(0, int(a["deadline"] - time.time()))
    return (f"{a['id']}  {a['state']}  run {a['run']} ({a['runtime']})  {a['upstream']}:{a['purpose']}\n"
            f"  {a['method']} {a['path']}  {a['size']} bytes  digest {a['digest']}\n"
            f"  approvers: {a['approvers'] or 'security team'}  "
            + (f"{left}s left" if a["state"] == "pending" else f"decided by {a['decided_by']} {a['why']}"))


@approvals_group.command("list", context_settings=CONTEXT)
@BROKER_OPTION
@JSON_OPTION
def list_command(broker: str | None, as_json: bool) -> None:
    """Open approvals you may decide, soonest deadline first."""
    with broker_client(broker) as client:
        found = show(client.get("/v1/approvals"))["approvals"]
    if as_json:
        click.echo(json.dumps(found, indent=2))
    elif not found:
        click.echo("no request is waiting for approval")
    for approval in [] if as_json else found:
        click.echo(_describe(approval))


@approvals_group.command("show", context_settings=CONTEXT)
@click.argument("approval_id")
@BROKER_OPTION
@JSON_OPTION
def show_command(approval_id: str, broker: str | None, as_json: bool) -> None:
    """One approval: the held request, its digest and redacted preview, its state."""
    with broker_client(broker) as client:
        found = show(client.get(f"/v1/approvals/{approval_id}"))
    click.echo(json.dumps(found, indent=2) if as_json else f"{_describe(found)}\n--- preview ---\n"
               f"{found['preview']}")


@approvals_group.command("approve", context_settings=CONTEXT)
@click.argument("approval_id")
@REASON_OPTION
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@BROKER_OPTION
def approve_command(approval_id: str, reason: str, yes: bool, broker: str | None) -> None:
    """Let this one request go on (once), after showing it."""
    with broker_client(broker) as client:
        found = show(client.get(f"/v1/approvals/{approval_id}"))
        click.echo(f"{_describe(found)}\n--- preview ---\n{found['preview']}\n---")
        if not yes and not click.confirm("approve this request?", default=False):
            fail("not approved")
        decided = show(client.post(f"/v1/approvals/{approval_id}/approve",
                                   json={"digest": found["digest"], "reason": reason}))
    click.echo(f"approved {decided['id']} as {decided['decided_by']}")


@approvals_group.command("deny", context_settings=CONTEXT)
@click.argument("approval_id")
@REASON_OPTION
@BROKER_OPTION
def deny_command(approval_id: str, reason: str, broker: str | None) -> None:
    """Refuse this request: the sandbox gets 403 approval_denied."""
    with broker_client(broker) as client:
        decided = show(client.post(f"/v1/approvals/{approval_id}/deny", json={"reason": reason}))
    click.echo(f"denied {decided['id']} as {decided['decided_by']}")
