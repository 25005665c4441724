"""The last step's work: send the request to the pinned upstream and stream its answer back,
headers and body redacted, compressed bodies decoded first (``dial_and_stream`` calls ``exchange``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from gateways.credentials import inject
from gateways.encodings import BodyDecoder, body_decoder
from gateways.exchange import Exchange
from gateways.sse import SseRedactor, body_stream
from gateways.upstream import response_headers

if TYPE_CHECKING:
    from gateways.gateway import Gateway
    from gateways.http1 import Response
    from gateways.redact import Redactor, StreamRedactor

log = logging.getLogger("valetkey.gateway")
# methods sent again after the upstream refused an expired credential (RFC 9110 idempotent)
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


async def exchange(gw: Gateway, ex: Exchange, address: str, raw_target: bytes) -> None:
    """Send the request, then stream the response back redacted: every header value, and the body
    chunk by chunk (decoded first if the upstream compressed it although asked for identity).
    A body that does not decode is refused before any byte is sent, or cut where it stops decoding.
    Reasons: undecodable_response, decompression_bomb, sse_event_too_large, upstream_timeout,
    upstream_protocol_error."""
    response = await _open(gw, ex, address, raw_target)
    header_redactions = 0
    stream: SseRedactor | StreamRedactor | None = None
    try:
        redactor = ex.held.forms if ex.held is not None else await _current_redactor(gw)
        stream = body_stream(redactor, response.headers)  # SSE: redacted as the client joins it
        decoder = body_decoder(v for k, v in response.headers if k.lower() == b"content-encoding")
        body = _decoded_body(response, decoder)
        first = await anext(body, b"") if decoder else b""
        headers = response_headers(response.headers, gw.upstream)
        # one search over all values joined (an occurrence in any value is one in the joined text);
        # value by value only when it finds something
        if redactor.spans(b"\n".join(value for _, value in headers)):
            redacted = [(name, *redactor.redact(value)) for name, value in headers]
            headers = [(name, clean) for name, clean, _ in redacted]
            header_redactions = sum(count for _, _, count in redacted)
        headers.append((b"x-valetkey-request-id", ex.record.request_id.encode()))
        ex.record.status = response.status
        await ex.send({"type": "http.response.start", "status": response.status, "headers": headers})
        ex.response_started = True
        await _send_body(ex, stream.feed(first))
        last = b""
        async for piece in body:  # read to its end: leaving an async generator early costs a task
            if not decoder and response.complete:  # nothing follows: no suffix to hold back
                last += piece
            else:
                await _send_body(ex, stream.feed(piece))
        await _send_body(ex, stream.finish(last), more=False)
    finally:
        ex.record.redactions = header_redactions + (stream.count if stream else 0)
        await response.aclose()


async def _open(gw: Gateway, ex: Exchange, address: str, raw_target: bytes) -> Response:
    """Send the request; if the upstream refuses an issued credential (401, e.g. expired early or
    revoked upstream), refresh it once and send an idempotent request again with the new one."""
    response = await gw.client.open(ex.method, address, raw_target, ex.upstream_headers, ex.body)
    if response.status != 401 or ex.held is None or ex.claims is None or gw.credentials is None:
        return response
    if ex.method not in IDEMPOTENT or not isinstance(ex.body, bytes):
        gw.credentials.refresh_soon(ex.claims, ex.held.credential)  # not sent again: the next one works
        return response
    await response.aclose()
    ex.held = await gw.credentials.refresh_now(ex.claims, ex.held.credential)
    ex.record.credential_id = ex.held.credential.id
    headers = ex.forwarded(gw.upstream.injection)
    ex.upstream_headers, ex.upstream_query = inject(headers, ex.query, gw.upstream.injection,
                                                    ex.held.credential.value)
    path = raw_target.split(b"?", 1)[0]
    raw_target = path + (b"?" + ex.upstream_query if ex.upstream_query else b"")
    log.info('{"event":"credential_retry","request_id":"%s","kind":"%s"}', ex.record.request_id,
             ex.held.credential.kind)
    return await gw.client.open(ex.method, address, raw_target, ex.upstream_headers, ex.body)


async def _current_redactor(gw: Gateway) -> Redactor:
    """The first build after start-up or a rotation compiles the secret's patterns (a few hundred
    ms of regex compilation): it runs in a thread so the event loop keeps serving."""
    if gw.redactor_is_current():
        return gw.redactor()
    return await asyncio.to_thread(gw.redactor)


async def _decoded_body(response: Response, decoder: BodyDecoder) -> AsyncIterator[bytes]:
    """The body as the sandbox will read it (upstream errors arrive as gateway errors)."""
    async for chunk in response.iter_body():
        if not decoder:
            yield chunk
            continue
        for piece in decoder.feed(chunk):
            yield piece
    if decoder:
        for piece in decoder.finish():
            yield piece


async def _send_body(ex: Exchange, data: bytes, more: bool = True) -> None:
    if data or not more:
        ex.record.bytes_out += len(data)
        await ex.send({"type": "http.response.body", "body": data, "more_body": more})
