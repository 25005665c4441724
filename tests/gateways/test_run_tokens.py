"""A run token never leaves for an upstream (gateways/run_tokens.py), end to end.

Real gateways, broker, OpenBao, Redis and echo upstreams. A run token anywhere that would be
forwarded — a header the gateway keeps, the query, the path, a buffered body, raw or encoded — is
refused ``credential_passthrough`` before any dial, the audit line names the place and never the
token. The placeholder where the policy reads it (Authorization, x-api-key, Basic, ``?key=``), and
in headers that never leave, is the ordinary case and passes; so does a JWT that is not ours.
"""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from contract.claims import token_prefix
from tests.gateways.test_gateway import Refused
from tests.support.gateway_stack import Stack, audit_line

READ = {"upstream": "echo", "purpose": "read_items"}
UPLOAD = {"upstream": "echo", "purpose": "upload"}
KEYED = {"upstream": "keyed", "purpose": "read_items"}
QUERIED = {"upstream": "queried", "purpose": "read_items"}
# a JWT of another issuer (HS256, another header): not ours, never refused for its shape
FOREIGN_JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ."
               "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")

# (method, path, extra headers, content type, body): "{own}" is the request's own placeholder,
# "{other}" the same run's placeholder for another upstream
REFUSED = [
    pytest.param("GET", "/v1/items?t={own}", {}, None, None, "query:t", id="own-in-query"),
    pytest.param("GET", "/v1/items?t={other_pct}", {}, None, None, "query:t", id="other-percent-encoded"),
    pytest.param("GET", "/v1/items", {"X-Trace": "{other}"}, None, None, "header:x-trace", id="other-in-header"),
    pytest.param("GET", "/v1/items", {"X-Note": "see {own} there"}, None, None, "header:x-note",
                 id="own-inside-text"),
    pytest.param("GET", "/v1/items/{own}", {}, None, None, "path", id="own-in-path"),
    pytest.param("GET", "/v1/items?t=x{own}", {}, None, None, "query:t", id="own-glued-to-a-word"),
    pytest.param("POST", "/v1/blobs", {}, "application/json", '{"note": "{other}"}', "body:json",
                 id="other-in-json"),
    pytest.param("POST", "/v1/blobs", {}, "application/json", '{"note": "{own_escaped}"}', "body:json",
                 id="own-json-escaped"),
    pytest.param("POST", "/v1/blobs", {}, "application/x-www-form-urlencoded", "a=1&b={own}", "body:form",
                 id="own-in-form"),
    pytest.param("POST", "/v1/blobs", {}, "text/plain", "OPENAI_API_KEY={other}\n", "body:raw",
                 id="env-dump-as-text"),
]


def _fill(text: str, own: str, other: str) -> str:
    escaped = "".join(f"\\u{ord(c):04x}" if c in "eyJ" else c for c in own[:6]) + own[6:]
    return (text.replace("{own_escaped}", escaped).replace("{other_pct}", quote(other, safe=""))
            .replace("{own}", own).replace("{other}", other))


def _send(stack: Stack, token: str, method: str, path: str, headers: dict[str, str], ctype: str | None,
          body: str | None) -> httpx.Response:
    sent = {"Authorization": f"Bearer {token}", **headers}
    if ctype:
        sent["Content-Type"] = ctype
    with httpx.Client(base_url=stack.url("echo"), headers=sent, timeout=10) as client:
        request = client.build_request(method, path, content=body)
        request.url = request.url.copy_with(raw_path=path.encode())
        return client.send(request)


@pytest.mark.parametrize(("method", "path", "headers", "ctype", "body", "location"), REFUSED)
def test_run_token_refused(gateway_stack: Stack, method: str, path: str, headers: dict[str, str],
                           ctype: str | None, body: str | None, location: str) -> None:
    env = gateway_stack.mint([READ, UPLOAD, KEYED])["env"]
    own, other = env["ECHO_TOKEN"], env["KEYED_TOKEN"]
    filled = {k: _fill(v, own, other) for k, v in headers.items()}
    with Refused(gateway_stack, "echo"):
        response = _send(gateway_stack, own, method, _fill(path, own, other), filled, ctype,
                         _fill(body, own, other) if body else None)
    assert (response.status_code, response.json()["error"]) == (403, "credential_passthrough"), response.text
    line = audit_line(gateway_stack, response.json()["request_id"])
    assert (line["reason"], line["passthrough"].split(":")[:2]) == ("credential_passthrough", location.split(":"))
    assert line["run"] == gateway_stack_run(own)
    assert own not in json.dumps(line)
    assert other not in json.dumps(line)


def gateway_stack_run(token: str) -> str:
    payload = token.split(".")[1]
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return str(claims["sub"])


def test_placeholder_where_the_policy_reads_it(gateway_stack: Stack) -> None:
    """The ordinary requests: each upstream's placeholder where its policy reads it, the same
    placeholder in headers that never leave, and another issuer's JWT anywhere."""
    env = gateway_stack.mint([READ, KEYED, QUERIED])["env"]
    answers = [
        httpx.get(f"{gateway_stack.url('echo')}/v1/items", params={"jwt": FOREIGN_JWT}, headers={
            "Authorization": f"Bearer {env['ECHO_TOKEN']}", "Cookie": f"session={env['KEYED_TOKEN']}",
            "X-Api-Key": env["KEYED_TOKEN"], "X-Foreign": FOREIGN_JWT}),
        httpx.get(f"{gateway_stack.url('keyed')}/v1/items", headers={"x-api-key": env["KEYED_TOKEN"]}),
        httpx.get(f"{gateway_stack.url('queried')}/v1/items", params={"key": env["QUERIED_TOKEN"], "page": "2"}),
    ]
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text[:300] for a in answers]
    for name in ("echo", "keyed", "queried"):
        seen = gateway_stack.upstreams[name].seen[-1]
        sent = json.dumps(seen.headers) + seen.query + seen.body.decode("latin-1")
        assert token_prefix() not in sent, name
    assert FOREIGN_JWT in gateway_stack.upstreams["echo"].seen[-1].query
