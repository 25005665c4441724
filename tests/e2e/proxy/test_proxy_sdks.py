"""The openai and anthropic SDKs with their DEFAULT base URLs (``api.openai.com``,
``api.anthropic.com``), through the egress proxy, holding only the run bundle's env: the
placeholder as the API key, the proxy and the CA from the environment (httpx ``trust_env``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import assert_never_saw, run_client
from tests.e2e.proxy.conftest import every_secret, sandbox_for
from tests.support.proxy_stack import ProxyStack
from valetkey.dev.demo import anthropic_like, openai_like

CLIENTS = Path(__file__).parent / "clients"


def inner(line: dict[str, object]) -> bool:
    """A line about a request inside the tunnel (not the CONNECT decision)."""
    return line.get("method") not in (None, "", "CONNECT")


@pytest.mark.slow  # importing the SDK alone takes seconds on a loaded machine
def test_openai_sdk_default_base_url(stack: ProxyStack, tmp_path: Path) -> None:
    bundle, box = sandbox_for(stack, tmp_path, "openai")
    assert "OPENAI_BASE_URL" not in box.env
    upstream = stack.upstreams["openai"]
    before = len(upstream.app.seen)

    ran = run_client([sys.executable, str(CLIENTS / "openai_default.py")], box.env)

    assert ran.returncode == 0, ran.stderr[-3000:] + "\n--- proxy log:\n" + stack.log_tail()
    result = json.loads(ran.stdout)
    assert result["base_url"] == "https://api.openai.com/v1/"
    assert result["completion"]["choices"][0]["message"]["content"] == openai_like.reply_text(
        [{"role": "user", "content": "Say hello to the proxy"}])
    assert result["streamed"] == openai_like.reply_text([{"role": "user", "content": "Stream a hello"}])
    assert result["chunks"] > 3
    assert result["models"] == ["gpt-demo", "gpt-demo-mini"]

    secret, placeholder = stack.secret("openai"), bundle["env"]["OPENAI_API_KEY"]
    seen = upstream.app.seen[before:]
    assert [(s.method, s.path) for s in seen] == [
        ("POST", "/v1/chat/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models")]
    assert all(s.header("authorization") == [f"Bearer {secret}"] for s in seen)
    assert not any(placeholder in repr(s) for s in seen)
    assert upstream.sni[-1] == "api.openai.com"
    for value in every_secret(stack):
        assert_never_saw(value, ran.stdout, ran.stderr, json.dumps(box.env))

    lines = stack.named_audit(bundle["run_id"], "openai", 3)
    assert sorted((x.get("method"), x.get("purpose"), x.get("decision"), x.get("status")) for x in lines
                  if inner(x)) == [
        ("GET", "list_models", "allow", 200), ("POST", "chat", "allow", 200), ("POST", "chat", "allow", 200)]
    assert {x.get("runtime") for x in lines} == {"proxy-agent"}


@pytest.mark.slow
def test_anthropic_sdk_default_base_url(stack: ProxyStack, tmp_path: Path) -> None:
    bundle, box = sandbox_for(stack, tmp_path, "anthropic")
    assert "ANTHROPIC_BASE_URL" not in box.env
    upstream = stack.upstreams["anthropic"]
    before = len(upstream.app.seen)

    ran = run_client([sys.executable, str(CLIENTS / "anthropic_default.py")], box.env)

    assert ran.returncode == 0, ran.stderr[-3000:] + "\n--- proxy log:\n" + stack.log_tail()
    result = json.loads(ran.stdout)
    assert result["base_url"].rstrip("/") == "https://api.anthropic.com"
    assert [(b["type"], b["text"]) for b in result["message"]["content"]] == [
        ("text", anthropic_like.reply_text([{"role": "user", "content": "Say hello to the proxy"}]))]
    assert result["streamed"] == anthropic_like.reply_text([{"role": "user", "content": "Stream a hello"}])
    assert result["pieces"] > 3

    secret, placeholder = stack.secret("anthropic"), bundle["env"]["ANTHROPIC_API_KEY"]
    seen = upstream.app.seen[before:]
    assert [(s.method, s.path) for s in seen] == [("POST", "/v1/messages")] * 2
    assert all(s.header("x-api-key") == [secret] for s in seen)
    assert not any(placeholder in repr(s) for s in seen)
    for value in every_secret(stack):
        assert_never_saw(value, ran.stdout, ran.stderr, json.dumps(box.env))

    lines = stack.named_audit(bundle["run_id"], "anthropic", 2)
    assert [(x.get("method"), x.get("purpose"), x.get("decision")) for x in lines if inner(x)] == [
        ("POST", "messages", "allow")] * 2
