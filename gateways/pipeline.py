"""The gateway's request pipeline: one ordered list of small named steps, read top to bottom.

    check_request → refuse_passthrough → authenticate → authorize → refuse_enterprise_denied
    → refuse_credential_fields → hold_run_slot → charge_budget → read_body → refuse_run_tokens
    → hold_for_approval → inject_secret → dial_and_stream
    (audit always, in ``handle``)

Each step reads and may fill fields of the ``Exchange``; a refusal is a ``ValetkeyError`` whose
reason code goes unchanged into the response body, the audit line and the metric. Nothing is
sent upstream before ``dial``, so a refused request never opens an upstream connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from contract.errors import (
    BadRequest,
    Decision,
    Forbidden,
    GatewayTimeout,
    MethodNotAllowed,
    PayloadTooLarge,
    Reason,
    TokenInvalid,
    UpstreamError,
    ValetkeyError,
    render,
)
from gateways.approval_step import hold_for_approval, refuse_enterprise_denied
from gateways.credential_scan import Finding, media_type
from gateways.credentials import extract_placeholder, inject
from gateways.exchange import Exchange
from gateways.fields import FieldRules, find_in_body, find_in_query
from gateways.paths import canonical_path
from gateways.run_tokens import refuse_run_tokens
from gateways.streaming import exchange
from policies.model import Placement

if TYPE_CHECKING:
    from gateways.gateway import Gateway

log = logging.getLogger("valetkey.gateway")
REFUSED_METHODS = frozenset({"TRACE", "TRACK", "CONNECT", "DEBUG"})
SCANNED_TYPES = ("application/json", "application/x-www-form-urlencoded", "multipart/form-data",
                 "text/plain")
SCAN_ANY_BELOW = 1024 * 1024  # bodies this small (declared, or chunked and ending within it) are
# buffered and scanned whatever their type
FIELDS_INLINE_BELOW = 64 * 1024  # larger bodies have their field names walked in a thread


async def check_request(gw: Gateway, ex: Exchange) -> None:
    """Request framing and target. Reads method, target and framing headers.
    Reasons: method_refused, absolute_form_target, duplicate_host, ambiguous_framing."""
    if ex.method in REFUSED_METHODS:
        raise MethodNotAllowed(f"{ex.method} is never forwarded")
    raw_path = bytes(ex.scope.get("raw_path") or b"")
    if not raw_path.startswith(b"/"):
        # ``http://user:key@host/…`` can carry a credential anywhere: none of it is audited
        ex.record.path = "[target withheld: not origin-form]"
        raise BadRequest("only origin-form request targets are accepted", Reason.ABSOLUTE_FORM_TARGET)
    if len(ex.header(b"host")) > 1:
        raise BadRequest("more than one Host header", Reason.DUPLICATE_HOST)
    lengths = set(ex.header(b"content-length"))
    encodings = ex.header(b"transfer-encoding")
    if (lengths and encodings) or len(lengths) > 1:
        raise BadRequest("conflicting Content-Length / Transfer-Encoding", Reason.AMBIGUOUS_FRAMING)
    if any(v.strip().lower() != b"chunked" for v in encodings):
        raise BadRequest("only chunked transfer-encoding is accepted", Reason.AMBIGUOUS_FRAMING)


async def refuse_passthrough(gw: Gateway, ex: Exchange) -> None:
    """A real-looking provider credential anywhere in headers or query: refused, never logged.
    Reads headers and query. Reason: credential_passthrough."""
    scanner = gw.scanner()
    finding = scanner.scan_headers(ex.headers) or scanner.scan_query(ex.query) or _scan_path(gw, ex)
    if finding is not None:
        ex.record.passthrough = finding.location
        await _attribute(gw, ex)
        raise Forbidden(f"a real credential was sent in {finding.location}; the sandbox must only "
                        "hold placeholders", Reason.CREDENTIAL_PASSTHROUGH)


def _scan_path(gw: Gateway, ex: Exchange) -> Finding | None:
    finding = gw.scanner().scan_path(bytes(ex.scope.get("raw_path") or b""))
    if finding is not None:
        ex.record.path = "[path withheld: it carried a credential]"
    return finding


async def _attribute(gw: Gateway, ex: Exchange) -> None:
    """Best effort: name the run behind a refused request so its alerts can act on it."""
    try:
        token = extract_placeholder(gw.upstream.injection, ex.headers, ex.query, gw.realm)
        ex.claims = await gw.verifier.verify(token)
    except ValetkeyError:
        return
    ex.record.run, ex.record.runtime = ex.claims.sub, ex.claims.client_id


async def authenticate(gw: Gateway, ex: Exchange) -> None:
    """The run token from where the policy puts the credential, verified for this audience and a
    live run. Fills claims. Reasons: missing_token, invalid_token, audience_mismatch, token_revoked,
    revocation_state_stale, jwks_stale, jwks_unavailable."""
    token = extract_placeholder(gw.upstream.injection, ex.headers, ex.query, gw.realm)
    try:
        ex.claims = await gw.verifier.verify(token)
    except TokenInvalid as exc:
        if exc.claims is not None:  # signed by our broker: name its run in the audit line
            ex.record.run, ex.record.runtime = exc.claims.sub, exc.claims.client_id
        scheme = "Basic" if gw.upstream.injection.placement is Placement.BASIC else "Bearer"
        exc.headers = {"www-authenticate": f'{scheme} realm="{gw.realm}", error="invalid_token"'}
        raise
    ex.record.run, ex.record.runtime = ex.claims.sub, ex.claims.client_id


async def authorize(gw: Gateway, ex: Exchange) -> None:
    """Method + canonical path must match a purpose granted in the token, with its bound params.
    Fills path and purpose. Reason: purpose_not_granted."""
    if ex.claims is None:
        raise TokenInvalid("no verified token", check="pipeline")
    ex.path = canonical_path(bytes(ex.scope.get("raw_path") or b"/"))
    for grant in ex.claims.grants:
        purpose = gw.upstream.purposes.get(grant.purpose)
        if purpose is None or ex.method not in purpose.methods:
            continue
        if any(t.matches(ex.path.segments, grant.params) for t in purpose.paths):
            ex.purpose = purpose
            ex.record.purpose = purpose.name
            return
    raise Forbidden(f"{ex.method} {ex.path} is not within a purpose granted to this run",
                    Reason.PURPOSE_NOT_GRANTED)


async def refuse_credential_fields(gw: Gateway, ex: Exchange) -> None:
    """A value under a credential-named query parameter (``?api_key=…``), whatever it looks like,
    unless the policy injects that parameter or the purpose allows the name (gateways/fields.py).
    Reads query and purpose. Reason: credential_passthrough."""
    finding = find_in_query(ex.query, FieldRules.of(gw.upstream.injection, ex.purpose))
    if finding is not None:
        _refuse_field(ex, finding)


def _refuse_field(ex: Exchange, finding: Finding) -> None:
    ex.record.passthrough = finding.location
    raise Forbidden(f"a credential-named field was sent in {finding.location}; the sandbox must "
                    "only hold placeholders", Reason.CREDENTIAL_PASSTHROUGH)


async def hold_run_slot(gw: Gateway, ex: Exchange) -> None:
    """One of the run's in-flight slots in this process, held until the response ends (released
    in ``handle``). Fills release_slot. Reason: run_concurrency_exceeded (429, Retry-After)."""
    if ex.claims is not None:
        ex.release_slot = gw.slots.acquire(ex.claims.sub)


async def charge_budget(gw: Gateway, ex: Exchange) -> None:
    """Take one request from the run's rate limit for this purpose and its totals at this
    upstream (atomic in Redis, shared by every replica). Reason: budget_exceeded (429)."""
    if ex.claims is not None and ex.purpose is not None:
        await gw.budgets.charge(ex.claims, ex.purpose, time.time())


async def read_body(gw: Gateway, ex: Exchange) -> None:
    """Enforce the purpose's body limit; buffer and scan JSON, form and small bodies for
    credentials (by shape, then by field name), stream the rest. Fills body.
    Reasons: body_too_large, credential_passthrough."""
    limit = (ex.purpose.limits.max_body if ex.purpose else None) or gw.settings.default_max_body
    declared = ex.header(b"content-length")
    size = int(declared[0]) if declared and declared[0].isdigit() else None
    if size is not None and size > limit:
        raise PayloadTooLarge(f"request body over this purpose's limit of {limit} bytes")
    if size is None and not ex.header(b"transfer-encoding"):
        return  # no body framing: no body (and no chunked empty body sent upstream)
    content_type = (ex.header(b"content-type") or [b""])[0].decode("latin-1")
    scan = media_type(content_type).startswith(SCANNED_TYPES) or media_type(content_type).endswith(
        "+json") or (size is not None and size <= SCAN_ANY_BELOW)
    stream = _limited_stream(ex, limit)
    chunks: list[bytes] = []
    if not scan:
        # a chunked body of a type not scanned by name may still be small: read up to
        # SCAN_ANY_BELOW ahead, and scan it whole if it ends there; a longer one is streamed
        ahead = 0
        async for chunk in stream:
            chunks.append(chunk)
            ahead += len(chunk)
            if ahead > SCAN_ANY_BELOW:
                ex.body = _replay(chunks, stream)
                return
    else:
        chunks = [chunk async for chunk in stream]
    ex.body = b"".join(chunks)
    finding = gw.scanner().scan_body(ex.body, content_type)
    if finding is not None:
        ex.record.passthrough = finding.location
        raise Forbidden(f"a real credential was sent in {finding.location}",
                        Reason.CREDENTIAL_PASSTHROUGH)
    rules = FieldRules.of(gw.upstream.injection, ex.purpose)
    if len(ex.body) <= FIELDS_INLINE_BELOW:
        finding = find_in_body(ex.body, content_type, rules)
    else:  # walking a large document's names takes ms: in a thread, the event loop keeps serving
        finding = await asyncio.to_thread(find_in_body, ex.body, content_type, rules)
    if finding is not None:
        _refuse_field(ex, finding)


async def _replay(read: list[bytes], rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    for chunk in read:
        yield chunk
    async for chunk in rest:
        yield chunk


async def _limited_stream(ex: Exchange, limit: int) -> AsyncIterator[bytes]:
    while True:
        message = await ex.receive()
        if message["type"] == "http.disconnect":
            raise BadRequest("client went away while sending the body", Reason.CLIENT_DISCONNECTED)
        chunk = bytes(message.get("body", b""))
        ex.record.bytes_in += len(chunk)
        if ex.record.bytes_in > limit:
            raise PayloadTooLarge(f"request body over this purpose's limit of {limit} bytes")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


async def inject_secret(gw: Gateway, ex: Exchange) -> None:
    """Strip every client credential and routing header, then inject the real secret: the KV
    secret, or the run's credential from its source (issued on the run's first request, cached).
    Fills upstream_headers, upstream_query and held. Reasons: secret_unavailable (store stale),
    credential_source_unavailable, credential_source_refused."""
    if gw.credentials is not None and ex.claims is not None:
        ex.held = await gw.credentials.get(ex.claims)
        credential = ex.held.credential
        ex.record.credential_kind, ex.record.credential_id = credential.kind, credential.id
        secret = credential.value
    else:
        secret = gw.secrets.current()
    headers = ex.forwarded(gw.upstream.injection)
    ex.upstream_headers, ex.upstream_query = inject(headers, ex.query, gw.upstream.injection, secret)


async def dial_and_stream(gw: Gateway, ex: Exchange) -> None:
    """Dial the pinned address, then stream the response back chunk by chunk, redacted.
    Reasons: dest_* (egress guard), upstream_* (timeouts, unreachable)."""
    target = gw.resolver.current()
    ex.record.upstream_addr = f"{target.address}:{target.port}"
    if ex.path is None:
        raise BadRequest("no path", Reason.INVALID_REQUEST)
    raw_target = ex.path.raw.encode() + (b"?" + ex.upstream_query if ex.upstream_query else b"")
    untrack = gw.revocations.track(ex.claims) if ex.claims else (lambda: None)
    try:
        async with asyncio.timeout(gw.settings.total_timeout):
            await exchange(gw, ex, target.address, raw_target)
    except TimeoutError:
        raise GatewayTimeout("the exchange exceeded the total time limit", Reason.UPSTREAM_TIMEOUT) from None
    finally:
        untrack()
        if ex.claims is not None and ex.record.bytes_out:
            await gw.budgets.add_bytes(ex.claims, ex.record.bytes_out, time.time())
    ex.record.decision, ex.record.reason = Decision.ALLOW, Reason.OK.value


STEPS: tuple[Callable[[Gateway, Exchange], Awaitable[None]], ...] = (
    check_request,
    refuse_passthrough,
    authenticate,
    authorize,
    refuse_enterprise_denied,
    refuse_credential_fields,
    hold_run_slot,
    charge_budget,
    read_body,
    refuse_run_tokens,
    hold_for_approval,
    inject_secret,
    dial_and_stream,
)


Step = Callable[["Gateway", Exchange], Awaitable[None]]


async def handle(gw: Gateway, ex: Exchange, steps: tuple[Step, ...] = STEPS) -> None:
    """Run the steps in order; render a refusal; always write the audit line. The egress proxy
    runs the same ``handle`` with its own step lists (``proxy/steps.py``)."""
    try:
        for step in steps:
            await step(gw, ex)
    except ValetkeyError as exc:
        ex.record.decision = Decision.of(exc)
        ex.record.reason = exc.code
        if not ex.response_started:
            await send_error(ex, exc)
    except asyncio.CancelledError as cancel:
        # the revocation watcher cancels streams of a run revoked mid-response: cut, not crash
        task = asyncio.current_task()
        if not str(cancel.args[0] if cancel.args else "").startswith("revoked") or task is None:
            raise
        task.uncancel()
        ex.record.decision, ex.record.reason = Decision.DENY, Reason.TOKEN_REVOKED.value
        if not ex.response_started:
            await send_error(ex, TokenInvalid("token revoked while the request was in flight",
                                              check="revoked", reason=Reason.TOKEN_REVOKED))
    except Exception as exc:  # a bug: answer without details, record it, keep serving
        ex.record.decision, ex.record.reason = Decision.ERROR, Reason.INTERNAL_ERROR.value
        log.error('{"event":"internal_error","request_id":"%s","type":"%s"}',
                  ex.record.request_id, type(exc).__name__)
        if not ex.response_started:
            await send_error(ex, UpstreamError("internal gateway error", Reason.INTERNAL_ERROR))
    finally:
        if ex.release_slot is not None:
            ex.release_slot()
        ex.record.duration_ms = round((time.perf_counter() - ex.started) * 1000, 3)
        gw.audit.write(ex.record, ex.claims.exp if ex.claims else 0)


async def send_error(ex: Exchange, exc: ValetkeyError) -> None:
    status, headers, body = render(exc, request_id=ex.record.request_id)
    headers.append((b"x-valetkey-request-id", ex.record.request_id.encode()))
    ex.record.status = status
    await ex.send({"type": "http.response.start", "status": status, "headers": headers})
    await ex.send({"type": "http.response.body", "body": body, "more_body": False})
    ex.response_started = True
