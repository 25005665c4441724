"""The official ``anthropic`` SDK, configured only from a run bundle, through the anthropic gateway
(the ``x-api-key`` placement)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.e2e.conftest import Stack, assert_never_saw, run_client, sandbox_env
from valetkey.dev.demo.anthropic_like import reply_text

CLIENT = Path(__file__).parent / "clients" / "anthropic_messages.py"


def test_message_and_stream(e2e_stack: Stack, tmp_path: Path) -> None:
    bundle = e2e_stack.mint(("anthropic",))
    env = sandbox_env(bundle, tmp_path / "home")
    before = len(e2e_stack.demo.seen["anthropic"])

    ran = run_client([sys.executable, str(CLIENT)], env)

    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout)
    message = result["message"]
    assert message["type"] == "message"
    assert message["role"] == "assistant"
    assert message["stop_reason"] == "end_turn"
    assert [(b["type"], b["text"]) for b in message["content"]] == [
        ("text", reply_text([{"role": "user", "content": "Say hello to the gateway"}]))]
    expected = reply_text([{"role": "user", "content": "Stream a hello"}])
    assert result["streamed"] == expected
    assert result["pieces"] > 3  # streamed word by word, not buffered into one event
    assert result["final"]["content"][0]["text"] == expected
    assert result["final"]["stop_reason"] == "end_turn"
    assert result["final"]["usage"]["output_tokens"] > 0
    assert result["stream_headers"]["content-type"].startswith("text/event-stream")

    secret, placeholder = e2e_stack.secret("anthropic"), bundle["env"]["ANTHROPIC_API_KEY"]
    seen = e2e_stack.demo.seen["anthropic"][before:]
    assert [(s.method, s.path) for s in seen] == [("POST", "/v1/messages"), ("POST", "/v1/messages")]
    assert all(s.header("x-api-key") == [secret] for s in seen)
    assert all(s.header("anthropic-version") for s in seen)
    assert not any(placeholder in repr(s) for s in seen)
    assert_never_saw(secret, ran.stdout, ran.stderr)

    lines = e2e_stack.audit(bundle["run_id"], 2)
    assert sorted((x["method"], x["path"], x["purpose"], x["decision"], x["status"]) for x in lines) == [
        ("POST", "/v1/messages", "messages", "allow", 200)] * 2
    assert {(x["upstream"], x["runtime"]) for x in lines} == {("anthropic", "demo-agent")}


def test_x_api_key_clients_work_too(e2e_stack: Stack, tmp_path: Path) -> None:
    """anthropic SDK 1.x and raw HTTP clients send the key as ``x-api-key`` (2.x as Bearer): the
    policy accepts the placeholder in both places and always injects ``x-api-key``."""
    from tests.e2e.test_curl import curl

    bundle = e2e_stack.mint(("anthropic",))
    env = sandbox_env(bundle, tmp_path / "home")
    before = len(e2e_stack.demo.seen["anthropic"])
    body = json.dumps({"model": "demo", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "request.json").write_text(body)
    reply = curl(env, tmp_path / "work", '-H "x-api-key: $ANTHROPIC_API_KEY" -H "anthropic-version: 2023-06-01" '
                 '-H "content-type: application/json" --data @request.json "$ANTHROPIC_BASE_URL/v1/messages"')
    assert reply.status == 200, reply.body
    assert reply.json()["type"] == "message"
    seen = e2e_stack.demo.seen["anthropic"][before:]
    assert [s.header("x-api-key") for s in seen] == [[e2e_stack.secret("anthropic")]]
    assert seen[0].header("authorization") == []
    assert_never_saw(e2e_stack.secret("anthropic"), reply.everything)
