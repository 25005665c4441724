"""The two approval steps of the pipeline (``gateways/pipeline.py`` runs them in its order).

``refuse_enterprise_denied`` (after authorize) refuses what the enterprise deny list names, before
any approval could be asked: no person can allow it. ``hold_for_approval`` (after read_body, before
inject_secret) holds a request of a purpose with ``approval: required``: its body buffered (within
the purpose's ``max_body``, already enforced), the secret not injected, nothing sent upstream,
until a person approves that very request (``contract/approvals.py``), denies it, the purpose's
``approval_timeout`` passes, the run is revoked or the client hangs up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from contract import audit_stream
from contract.approvals import PREVIEW_BYTES, PendingApproval, new_id, preview, request_digest
from contract.errors import (
    BadRequest,
    Forbidden,
    Reason,
    TokenInvalid,
    TooManyRequests,
    Unavailable,
    ValetkeyError,
)
from gateways.credentials import extract_placeholder
from gateways.exchange import Exchange

if TYPE_CHECKING:
    from gateways.gateway import Gateway

log = logging.getLogger("valetkey.gateway")


async def refuse_enterprise_denied(gw: Gateway, ex: Exchange) -> None:
    """The enterprise deny list, checked on every request after its purpose is known.
    Reads purpose, method and path. Reason: enterprise_denied (403; never approvable)."""
    if ex.purpose is None or ex.path is None:
        return
    rule = gw.enterprise.denied(gw.upstream.name, ex.purpose.name, ex.method, ex.path.segments)
    if rule is not None:
        raise Forbidden(f"never allowed by the enterprise deny list: {rule.why}", Reason.ENTERPRISE_DENIED)


async def hold_for_approval(gw: Gateway, ex: Exchange) -> None:
    """A purpose with ``approval: required``: buffer the body, record a pending approval in Redis
    (run, runtime, upstream, purpose, method, path, body digest, redacted preview), notify the
    webhook, wait. Fills body (bytes) and the audit line's approval and approved_by.
    Reasons: approval_denied, approval_timeout (403), approval_queue_full (429), token_revoked,
    client_disconnected, redis_unavailable."""
    policy = ex.purpose.approval if ex.purpose else None
    if policy is None or ex.claims is None or ex.purpose is None or ex.path is None:
        return
    if not isinstance(ex.body, bytes):
        ex.body = b"".join([chunk async for chunk in ex.body])  # bounded by max_body in read_body
    target = ex.path.raw + ("?" + ex.query.decode("latin-1") if ex.query else "")
    if gw.approvals.held >= gw.approvals.max_held:
        raise TooManyRequests("this gateway holds as many requests for approval as it may",
                              Reason.APPROVAL_QUEUE_FULL)
    now = time.time()
    approval = PendingApproval(
        id=new_id(), run=ex.claims.sub, runtime=ex.claims.client_id, upstream=gw.upstream.name,
        purpose=ex.purpose.name, approvers=policy.approvers, method=ex.method, path=ex.record.path,
        digest=request_digest(gw.upstream.name, ex.method, target, ex.body),
        preview=_redacted(gw, ex, ex.body), size=len(ex.body), created=now, deadline=now + policy.timeout,
        request_id=ex.record.request_id)
    if not await gw.approvals.store.create(approval, gw.settings.approval_per_run):
        raise TooManyRequests(f"this run already has {gw.settings.approval_per_run} requests waiting "
                              "for approval", Reason.APPROVAL_QUEUE_FULL)
    ex.record.approval = approval.id
    await _event(gw, "approval_requested", approval)
    gw.webhook.send({**_summary(approval), "event": "approval_requested",
                     "console_url": _console_link(gw, approval)})
    state = await _wait(gw, ex, approval)
    if state == "approved":
        decided = await gw.approvals.store.get(approval.id)
        ex.record.approved_by = decided.decided_by if decided else "?"
        return
    if state == "timeout":
        await _event(gw, "approval_timeout", approval)
        raise Forbidden(f"nobody approved this request within {policy.timeout}s", Reason.APPROVAL_TIMEOUT)
    if state == "cancelled":
        if gw.revocations.state.find(ex.claims) is not None:
            raise TokenInvalid("the run was revoked while its request waited for approval",
                               check="revoked", reason=Reason.TOKEN_REVOKED)
        raise BadRequest("client went away while its request waited for approval", Reason.CLIENT_DISCONNECTED)
    decided = await gw.approvals.store.get(approval.id)
    why = f": {decided.why}" if decided and decided.why else ""
    ex.record.approved_by = decided.decided_by if decided else ""
    raise Forbidden(f"a person denied this request{why}", Reason.APPROVAL_DENIED)


async def _wait(gw: Gateway, ex: Exchange, approval: PendingApproval) -> str:
    gone = asyncio.Event()
    watch = asyncio.create_task(_watch_client(ex, gone), name="approval-client-watch")
    untrack = gw.revocations.track(ex.claims) if ex.claims else (lambda: None)
    try:
        return await gw.approvals.wait(approval, gone)
    except asyncio.CancelledError:
        # the run was revoked while its request waited: the record says so (the watcher cut us)
        with contextlib.suppress(Unavailable):
            await asyncio.shield(gw.approvals.store.settle(approval, "cancelled", "revoked"))
        raise
    finally:
        untrack()
        watch.cancel()


async def _watch_client(ex: Exchange, gone: asyncio.Event) -> None:
    """The body is read: the next message the server gives is the client hanging up."""
    while True:
        message = await ex.receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return


def _redacted(gw: Gateway, ex: Exchange, body: bytes) -> str:
    """What the approver reads: the query and the start of the body with every held form of the secret masked
    (a body carrying one was refused already; this is the second lock) and the run's own token
    too (an approver is not given the bearer credential of the run it judges)."""
    text = preview(body)
    if ex.query:  # the audit line masks query values; the person deciding must read them
        text = f"?{ex.query[:PREVIEW_BYTES].decode('latin-1')}\n\n{text}"
    hidden = [s.reveal() for s in gw.secrets.all_values()]
    with contextlib.suppress(ValetkeyError):
        hidden.append(extract_placeholder(gw.upstream.injection, ex.headers, ex.query, gw.realm))
    for value in filter(None, hidden):
        text = text.replace(value, "[REDACTED:valetkey]")
    return text


def _summary(approval: PendingApproval) -> dict[str, Any]:
    return {"approval": approval.id, "run": approval.run, "runtime": approval.runtime,
            "upstream": approval.upstream, "purpose": approval.purpose, "method": approval.method,
            "path": approval.path, "digest": approval.digest, "approvers": approval.approvers,
            "deadline": approval.deadline, "request_id": approval.request_id}


def _console_link(gw: Gateway, approval: PendingApproval) -> str:
    base = gw.settings.console_url.rstrip("/")
    return f"{base}/console/approvals/{approval.id}" if base else ""


async def _event(gw: Gateway, name: str, approval: PendingApproval) -> None:
    """The approval's own line in the audit stream (the request's line follows when it ends)."""
    line = {**_summary(approval), "event": name, "time": time.time()}
    log.info(json.dumps(line, sort_keys=True))
    try:
        await audit_stream.append(gw.redis, line, kind="approval", maxlen=gw.settings.audit_maxlen)
    except Unavailable as exc:
        log.warning('{"event":"audit_stream_write_failed","action":"%s","reason":"%s"}', name, exc.code)
