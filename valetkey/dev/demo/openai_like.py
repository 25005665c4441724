"""An OpenAI-compatible demo upstream: chat completions (plain and streamed) and the model list.

Authentication is ``Authorization: Bearer <key>``; only the real secret is accepted, anything
else gets OpenAI's ``invalid_api_key`` error. Replies are canned: they quote the last user
message so a client can see its request went through.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from valetkey.dev.demo.common import DemoUpstream, bearer_token, json_response, same_secret, sse_event

MODELS = ("gpt-demo", "gpt-demo-mini")
CREATED = 1_700_000_000


def _error(status: int, message: str, kind: str, code: str | None, param: str | None = None) -> Response:
    return json_response({"error": {"message": message, "type": kind, "param": param, "code": code}}, status)


def _last_user_text(messages: list[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
                return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def reply_text(messages: list[Any]) -> str:
    return f"Hello from the valetkey demo model. You said: {_last_user_text(messages)[:200]}"


def _tokens(text: str) -> int:
    return max(1, len(text.split()))


@dataclass
class OpenAILike(DemoUpstream):
    def routes(self) -> Sequence[BaseRoute]:
        return [
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model}", self.model, methods=["GET"]),
        ]

    def authorized(self, headers: Headers) -> bool:
        return same_secret(bearer_token(headers), self.secret)

    def unauthorized(self, request: Request) -> Response:
        return _error(401, "Incorrect API key provided. You can find your API key in your account.",
                      "invalid_request_error", "invalid_api_key")

    async def models(self, request: Request) -> Response:
        return json_response({"object": "list", "data": [_model(m) for m in MODELS]})

    async def model(self, request: Request) -> Response:
        name = request.path_params["model"]
        if name not in MODELS:
            return _error(404, f"The model '{name}' does not exist", "invalid_request_error",
                          "model_not_found", "model")
        return json_response(_model(name))

    async def chat(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "We could not parse the JSON body of your request.",
                          "invalid_request_error", None)
        if not isinstance(body, dict):
            return _error(400, "The request body must be a JSON object.", "invalid_request_error", None)
        messages = body.get("messages")
        model = body.get("model")
        if not isinstance(messages, list) or not messages:
            return _error(400, "'messages' is a required property", "invalid_request_error", None, "messages")
        if not isinstance(model, str) or not model:
            return _error(400, "you must provide a model parameter", "invalid_request_error", None, "model")
        text = reply_text(messages)
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        usage = {"prompt_tokens": sum(_tokens(json.dumps(m)) for m in messages),
                 "completion_tokens": _tokens(text)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if body.get("stream"):
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            return StreamingResponse(
                _chunks(completion_id, model, text, usage if include_usage else None),
                media_type="text/event-stream", headers={"cache-control": "no-cache"},
            )
        return json_response({
            "id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                         "message": {"role": "assistant", "content": text, "refusal": None}}],
            "usage": usage, "system_fingerprint": "fp_valetkey_demo", "service_tier": "default",
        })


def _model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": CREATED, "owned_by": "valetkey-demo"}


async def _chunks(
    completion_id: str, model: str, text: str, usage: dict[str, int] | None
) -> AsyncIterator[bytes]:
    """``chat.completion.chunk`` events: the role, the text word by word, the finish reason,
    optionally the usage, then ``[DONE]``."""
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse_event({
            "id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": "fp_valetkey_demo",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        })

    yield chunk({"role": "assistant", "content": "", "refusal": None})
    words = text.split(" ")
    for n, word in enumerate(words):
        yield chunk({"content": word if n == len(words) - 1 else f"{word} "})
    yield chunk({}, "stop")
    if usage is not None:
        yield sse_event({"id": completion_id, "object": "chat.completion.chunk", "created": created,
                         "model": model, "choices": [], "usage": usage})
    yield sse_event("[DONE]")
