"""The official ``openai`` SDK, configured only from a run bundle, through the openai gateway."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.e2e.conftest import Stack, assert_never_saw, run_client, sandbox_env
from valetkey.dev.demo.openai_like import reply_text

CLIENT = Path(__file__).parent / "clients" / "openai_chat.py"


def test_chat_completion_and_stream(e2e_stack: Stack, tmp_path: Path) -> None:
    bundle = e2e_stack.mint(("openai",))
    env = sandbox_env(bundle, tmp_path / "home")
    before = len(e2e_stack.demo.seen["openai"])

    ran = run_client([sys.executable, str(CLIENT)], env)

    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout)
    completion = result["completion"]
    assert completion["object"] == "chat.completion"
    assert completion["choices"][0]["message"]["role"] == "assistant"
    assert completion["choices"][0]["message"]["content"] == reply_text(
        [{"role": "user", "content": "Say hello to the gateway"}])
    assert completion["choices"][0]["finish_reason"] == "stop"
    assert result["streamed"] == reply_text([{"role": "user", "content": "Stream a hello"}])
    chunks = result["chunks"]
    assert len(chunks) > 3
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["usage"]["total_tokens"] > 0  # stream_options.include_usage
    assert result["stream_headers"]["content-type"].startswith("text/event-stream")
    assert result["models"] == ["gpt-demo", "gpt-demo-mini"]

    # the upstream saw the real secret on every request, and never the placeholder
    secret, placeholder = e2e_stack.secret("openai"), bundle["env"]["OPENAI_API_KEY"]
    seen = e2e_stack.demo.seen["openai"][before:]
    assert [(s.method, s.path) for s in seen] == [
        ("POST", "/v1/chat/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models")]
    assert all(s.header("authorization") == [f"Bearer {secret}"] for s in seen)
    assert not any(placeholder in repr(s) for s in seen)
    # the client never saw it: not in its output, its response bodies or its response headers
    assert_never_saw(secret, ran.stdout, ran.stderr)

    lines = e2e_stack.audit(bundle["run_id"], 3)
    assert sorted((x["method"], x["path"], x["purpose"], x["decision"], x["reason"], x["status"])
                  for x in lines) == [
        ("GET", "/v1/models", "list_models", "allow", "ok", 200),
        ("POST", "/v1/chat/completions", "chat", "allow", "ok", 200),
        ("POST", "/v1/chat/completions", "chat", "allow", "ok", 200),
    ]
    assert {(x["upstream"], x["runtime"]) for x in lines} == {("openai", "demo-agent")}
    assert all(x["bytes_out"] > 0 and x["redactions"] == 0 for x in lines)
