"""Deciding held requests: the routes behind ``valetkey approvals`` (the console shares ``decide``).

    GET    /v1/approvals                     open approvals the caller may decide
    GET    /v1/approvals/{id}                one approval (any state), with its digest and preview
    POST   /v1/approvals/{id}/approve        {"digest": "<the digest shown>", "reason": "..."}
    POST   /v1/approvals/{id}/deny           {"reason": "..."}

Callers: the security team (admin Vault policy) sees and decides every approval; a member of an
approver group (a Vault policy named in the enterprise document) sees and decides only those of
purposes naming its group (others are ``404``). An approval must name the digest of the request it
approves (``approval_digest_mismatch`` otherwise); a decided, timed-out or cancelled approval is
``409 approval_not_pending``. Every decision is an audit event with who decided.
"""

from __future__ import annotations

import re
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from broker.bodies import read_json_object
from broker.callers import Caller
from broker.services import Services, authenticate, event, services
from contract import audit_stream
from contract.approvals import PendingApproval
from contract.errors import BadRequest, NotFound, Reason, Unavailable

DIGEST = re.compile(r"[0-9a-f]{64}")
MAX_REASON = 500


async def _caller(request: Request) -> tuple[Caller, Services]:
    caller = await authenticate(request)
    caller.require_admin_or_approver()
    return caller, services(request)


async def visible(svc: Services, caller: Caller) -> list[PendingApproval]:
    return [a for a in await svc.approvals.pending() if caller.may_decide(a.approvers)]


async def find(svc: Services, caller: Caller, approval_id: str) -> PendingApproval:
    found = await svc.approvals.get(approval_id)
    if found is None or not caller.may_decide(found.approvers):
        raise NotFound("no such approval", Reason.APPROVAL_NOT_FOUND)  # never reveal another group's
    return found


async def decide(svc: Services, caller: Caller, approval_id: str, approve: bool, digest: str,
                 why: str) -> PendingApproval:
    """Record one person's decision on one approval, and its audit line."""
    await find(svc, caller, approval_id)
    if approve and not DIGEST.fullmatch(digest):
        raise BadRequest("an approval names the digest of the request it approves (64 hex digits)")
    decided = await svc.approvals.decide(approval_id, approve, digest if approve else "", caller.name,
                                         why[:MAX_REASON])
    name = "approval_approved" if approve else "approval_denied"
    line: dict[str, Any] = {"event": name, "approval": decided.id,
            "run": decided.run, "runtime": decided.runtime, "upstream": decided.upstream,
            "purpose": decided.purpose, "method": decided.method, "path": decided.path,
            "digest": decided.digest, "who": caller.name, "why": decided.why, "time": time.time()}
    event(line["event"], **{k: v for k, v in line.items() if k != "event"})
    try:
        await audit_stream.append(svc.redis, line, kind="approval", maxlen=svc.settings.audit_maxlen)
    except Unavailable:
        event("audit_stream_write_failed", action=line["event"], approval=decided.id)
    return decided


async def list_approvals(request: Request) -> Response:
    caller, svc = await _caller(request)
    return JSONResponse({"approvals": [a.to_json() for a in await visible(svc, caller)]})


async def show_approval(request: Request) -> Response:
    caller, svc = await _caller(request)
    return JSONResponse((await find(svc, caller, request.path_params["approval_id"])).to_json())


async def approve(request: Request) -> Response:
    return await _decide(request, approve=True)


async def deny(request: Request) -> Response:
    return await _decide(request, approve=False)


async def _decide(request: Request, approve: bool) -> Response:
    caller, svc = await _caller(request)
    body: dict[str, Any] = await read_json_object(request)
    allowed = {"digest", "reason"} if approve else {"reason", "digest"}
    if set(body) - allowed:
        raise BadRequest(f"unknown members {sorted(set(body) - allowed)}; allowed: {sorted(allowed)}")
    digest, why = body.get("digest", ""), body.get("reason", "")
    if not isinstance(digest, str) or not isinstance(why, str):
        raise BadRequest("digest and reason must be strings")
    decided = await decide(svc, caller, request.path_params["approval_id"], approve, digest, why)
    return JSONResponse(decided.to_json())


ROUTES = [
    Route("/v1/approvals", list_approvals, methods=["GET"]),
    Route("/v1/approvals/{approval_id}", show_approval, methods=["GET"]),
    Route("/v1/approvals/{approval_id}/approve", approve, methods=["POST"]),
    Route("/v1/approvals/{approval_id}/deny", deny, methods=["POST"]),
]
