"""An Anthropic-compatible demo upstream: the Messages API (plain and streamed), token counting
and the model list.

Authentication is ``x-api-key`` (SDK 1.x) or ``Authorization: Bearer`` (SDK 2.x sends the key
so); only the real secret is accepted (``authentication_error`` otherwise), and every request
must name an ``anthropic-version``, as the real API requires.
A streamed message sends the events the SDK's accumulator expects, in order: ``message_start``,
``content_block_start``, ``ping``, ``content_block_delta``…, ``content_block_stop``,
``message_delta``, ``message_stop``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from valetkey.dev.demo.common import DemoUpstream, bearer_token, json_response, same_secret, sse_event

MODELS = ("claude-demo", "claude-demo-haiku")


def _error(status: int, kind: str, message: str) -> Response:
    return json_response({"type": "error", "error": {"type": kind, "message": message},
                          "request_id": f"req_{uuid.uuid4().hex[:24]}"}, status)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return ""


def reply_text(messages: list[Any]) -> str:
    last = next((m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"), {})
    return f"Hello from the valetkey demo Claude. You said: {_text_of(last.get('content'))[:200]}"


def _tokens(text: str) -> int:
    return max(1, len(text.split()))


@dataclass
class AnthropicLike(DemoUpstream):
    def routes(self) -> Sequence[BaseRoute]:
        return [
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
        ]

    def authorized(self, headers: Headers) -> bool:
        values = headers.getlist("x-api-key")
        if values:
            return len(values) == 1 and same_secret(values[0], self.secret)
        return same_secret(bearer_token(headers), self.secret)

    def unauthorized(self, request: Request) -> Response:
        return _error(401, "authentication_error", "invalid x-api-key")

    async def _request(self, request: Request) -> dict[str, Any] | Response:
        """The JSON body after the checks every Messages endpoint makes."""
        if not request.headers.get("anthropic-version"):
            return _error(400, "invalid_request_error", "anthropic-version: header is required")
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "invalid_request_error", "request body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "invalid_request_error", "request body must be a JSON object")
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return _error(400, "invalid_request_error", "messages: Field required")
        if not isinstance(body.get("model"), str) or not body["model"]:
            return _error(400, "invalid_request_error", "model: Field required")
        return body

    async def count_tokens(self, request: Request) -> Response:
        body = await self._request(request)
        if isinstance(body, Response):
            return body
        return json_response({"input_tokens": sum(_tokens(json.dumps(m)) for m in body["messages"])})

    async def models(self, request: Request) -> Response:
        if not request.headers.get("anthropic-version"):
            return _error(400, "invalid_request_error", "anthropic-version: header is required")
        data = [{"type": "model", "id": m, "display_name": m.replace("-", " ").title(),
                 "created_at": "2025-01-01T00:00:00Z"} for m in MODELS]
        return json_response({"data": data, "has_more": False, "first_id": MODELS[0], "last_id": MODELS[-1]})

    async def messages(self, request: Request) -> Response:
        body = await self._request(request)
        if isinstance(body, Response):
            return body
        if not isinstance(body.get("max_tokens"), int):
            return _error(400, "invalid_request_error", "max_tokens: Field required")
        text = reply_text(body["messages"])
        message_id = f"msg_{uuid.uuid4().hex[:24]}"
        input_tokens = sum(_tokens(json.dumps(m)) for m in body["messages"])
        if body.get("stream"):
            return StreamingResponse(_events(message_id, body["model"], text, input_tokens),
                                     media_type="text/event-stream", headers={"cache-control": "no-cache"})
        return json_response({
            "id": message_id, "type": "message", "role": "assistant", "model": body["model"],
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": _tokens(text)},
        })


async def _events(message_id: str, model: str, text: str, input_tokens: int) -> AsyncIterator[bytes]:
    yield sse_event({"type": "message_start", "message": {
        "id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1},
    }}, "message_start")
    yield sse_event({"type": "content_block_start", "index": 0,
                     "content_block": {"type": "text", "text": ""}}, "content_block_start")
    yield sse_event({"type": "ping"}, "ping")
    words = text.split(" ")
    for n, word in enumerate(words):
        piece = word if n == len(words) - 1 else f"{word} "
        yield sse_event({"type": "content_block_delta", "index": 0,
                         "delta": {"type": "text_delta", "text": piece}}, "content_block_delta")
    yield sse_event({"type": "content_block_stop", "index": 0}, "content_block_stop")
    yield sse_event({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                     "usage": {"output_tokens": _tokens(text)}}, "message_delta")
    yield sse_event({"type": "message_stop"}, "message_stop")
