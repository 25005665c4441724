"""A credential of no known shape, sent under a credential-named field: refused end to end.

Real gateway, broker, OpenBao, Redis and echo upstreams. Every refusal must carry
``credential_passthrough``, open no upstream connection, and leave the value out of the response,
the audit line and every log record; the allowed cases must reach the upstream unchanged.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest

from tests.gateways.test_fields import OPAQUE, multipart
from tests.gateways.test_gateway import Refused
from tests.support.gateway_stack import Stack, audit_line

READ = {"upstream": "echo", "purpose": "read_items"}
WRITE = {"upstream": "echo", "purpose": "write_item", "params": {"item": "42"}}
UPLOAD = {"upstream": "echo", "purpose": "upload"}
FORM = "application/x-www-form-urlencoded"
MULTI_BODY, MULTI_TYPE = multipart(('name="title"', "", b"x"), ('name="api_key"', "", OPAQUE.encode()))

# a part naming itself twice (parsers differ on which wins), and a type naming two boundaries
TWICE_NAMED = (b"--b1\r\nContent-Disposition: form-data; name=\"note\"\r\n"
               b"Content-Disposition: form-data; name=\"client_secret\"\r\n\r\n" + OPAQUE.encode()
               + b"\r\n--b1--\r\n")
TWO_BOUNDARIES = (b"--b2\r\nContent-Disposition: form-data; name=\"client_secret\"\r\n\r\n" + OPAQUE.encode()
                  + b"\r\n--b2--\r\n")
LOOSE_JSON = b'{"client_secret":"' + OPAQUE.encode() + b'","x":"\xff"}'  # not UTF-8: does not parse

REFUSALS = [
    pytest.param("GET", f"/v1/items?key={OPAQUE}", None, None, "query:key", id="query-key"),
    pytest.param("GET", f"/v1/items?q=1&access_token={OPAQUE}", None, None, "query:access_token",
                 id="query-access-token"),
    pytest.param("GET", f"/v1/items?api%5Fkey={OPAQUE}", None, None, "query:api_key", id="query-encoded-name"),
    pytest.param("GET", f"/v1/items?page=1&page=2&githubToken={OPAQUE}", None, None, "query:githubToken",
                 id="query-repeated-and-camel"),
    pytest.param("POST", "/v1/items/42", "application/json", json.dumps({"api_key": OPAQUE}),
                 "body:json:api_key", id="json"),
    pytest.param("POST", "/v1/items/42", "application/json",
                 json.dumps({"data": [{"auth": {"client_secret": OPAQUE}}]}), "body:json:client_secret",
                 id="json-nested"),
    pytest.param("POST", "/v1/items/42", "application/merge-patch+json", json.dumps({"password": OPAQUE}),
                 "body:json:password", id="plus-json"),
    pytest.param("POST", "/v1/items/42", FORM, f"title=x&private_token={OPAQUE}", "body:form:private_token",
                 id="form"),
    pytest.param("POST", "/v1/items/42", FORM, json.dumps({"openai_api_key": OPAQUE}),
                 "body:json:openai_api_key", id="json-sent-as-form"),
    pytest.param("POST", "/v1/items/42", MULTI_TYPE, MULTI_BODY, "body:multipart:api_key", id="multipart"),
    pytest.param("POST", "/v1/blobs", FORM, f"password=ok&token={OPAQUE}", "body:form:token",
                 id="allowed-field-does-not-allow-others"),
    pytest.param("POST", "/v1/blobs", "multipart/form-data; boundary=b1", TWICE_NAMED,
                 "body:multipart:client_secret", id="multipart-disposition-twice"),
    pytest.param("POST", "/v1/blobs", "multipart/form-data; boundary=b1; boundary=b2", TWO_BOUNDARIES,
                 "body:multipart:client_secret", id="multipart-two-boundaries"),
    pytest.param("POST", "/v1/blobs", "text/plain", LOOSE_JSON, "body:json:client_secret",
                 id="unparsable-json-as-text"),
    pytest.param("POST", "/v1/blobs", None, LOOSE_JSON, "body:json:client_secret", id="unparsable-json-untyped"),
    pytest.param("POST", "/v1/blobs", "application/octet-stream", [b'{"client_', b'secret": "' + OPAQUE.encode(), b'"}'],
                 "body:json:client_secret", id="chunked-untyped-json"),
    pytest.param("GET", "/v1/items", "application/json",
                 json.dumps({"pad": "p" * 100_000, "cfg": {"api": {"key": OPAQUE}}}), "body:json:api_key",
                 id="large-body-walked-in-a-thread"),
]


def _send(stack: Stack, token: str, method: str, path: str, ctype: str | None,
          body: str | bytes | list[bytes] | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"}
    if ctype:
        headers["Content-Type"] = ctype
    with httpx.Client(base_url=stack.url("echo"), headers=headers, timeout=10) as client:
        # a list is sent chunked, piece by piece (no Content-Length)
        request = client.build_request(method, path, content=iter(body) if isinstance(body, list) else body)
        request.url = request.url.copy_with(raw_path=path.encode())
        return client.send(request)


@pytest.mark.parametrize(("method", "path", "ctype", "body", "location"), REFUSALS)
def test_refused_by_field_name(gateway_stack: Stack, caplog: pytest.LogCaptureFixture, method: str,
                               path: str, ctype: str | None, body: str | bytes | list[bytes] | None,
                               location: str) -> None:
    caplog.set_level(logging.DEBUG)
    token = gateway_stack.mint([READ, WRITE, UPLOAD])["env"]["ECHO_TOKEN"]
    with Refused(gateway_stack, "echo"):
        response = _send(gateway_stack, token, method, path, ctype, body)
    assert (response.status_code, response.json()["error"]) == (403, "credential_passthrough"), response.text
    line = audit_line(gateway_stack, response.json()["request_id"])
    assert (line["reason"], line["passthrough"]) == ("credential_passthrough", location)
    everything = response.text + json.dumps(line) + caplog.text + json.dumps(
        [r.getMessage() for r in caplog.records])
    assert OPAQUE not in everything
    assert all(OPAQUE not in json.dumps(s.headers) + s.query + s.body.decode("latin-1")
               for up in gateway_stack.upstreams.values() for s in up.seen)


def test_query_placement_exempts_only_its_own_parameter(gateway_stack: Stack) -> None:
    token = gateway_stack.mint([{"upstream": "queried", "purpose": "read_items"}])["env"]["QUERIED_TOKEN"]
    url = f"{gateway_stack.url('queried')}/v1/items"
    with Refused(gateway_stack, "queried"):
        refused = httpx.get(url, params={"key": token, "api_key": OPAQUE})
    assert (refused.status_code, refused.json()["error"]) == (403, "credential_passthrough")
    assert audit_line(gateway_stack, refused.json()["request_id"])["passthrough"] == "query:api_key"
    fresh = gateway_stack.mint([{"upstream": "queried", "purpose": "read_items"}])["env"]["QUERIED_TOKEN"]
    allowed = httpx.get(url, params={"key": fresh, "page": "2"})
    assert allowed.status_code == 200, allowed.text
    assert f"key={gateway_stack.vault.secrets['queried']}" in gateway_stack.upstreams["queried"].seen[-1].query


ALLOWED: list[Any] = [
    pytest.param("POST", "/v1/blobs", FORM, f"password={OPAQUE}", id="purpose-allows-password"),
    pytest.param("POST", "/v1/items/42", "application/json",
                 json.dumps({"max_tokens": 5, "page_token": OPAQUE, "tags": [{"key": "k", "value": OPAQUE}],
                             "api_key": "", "token": None}), id="ordinary-and-empty-fields"),
    pytest.param("GET", "/v1/items?key=&max_tokens=3", None, None, id="empty-query-value"),
]


@pytest.mark.parametrize(("method", "path", "ctype", "body"), ALLOWED)
def test_allowed_fields_reach_the_upstream(gateway_stack: Stack, method: str, path: str, ctype: str | None,
                                           body: str | None) -> None:
    token = gateway_stack.mint([READ, WRITE, UPLOAD])["env"]["ECHO_TOKEN"]
    response = _send(gateway_stack, token, method, path, ctype, body)
    assert response.status_code == 200, response.text
    seen = gateway_stack.upstreams["echo"].seen[-1]
    assert seen.body == (body or "").encode()


def test_credential_named_headers_are_stripped(gateway_stack: Stack) -> None:
    """Headers are never refused by name (SDKs send the placeholder in several); they never leave."""
    token = gateway_stack.mint([READ])["env"]["ECHO_TOKEN"]
    response = httpx.get(f"{gateway_stack.url('echo')}/v1/items", headers={
        "Authorization": f"Bearer {token}", "X-Service-Token": OPAQUE, "X-Internal-Api-Key": OPAQUE,
        "Client-Secret": OPAQUE, "X-Max-Tokens": "5"})
    assert response.status_code == 200, response.text
    seen = gateway_stack.upstreams["echo"].seen[-1]
    assert OPAQUE not in json.dumps(seen.headers)
    assert seen.header("x-max-tokens") == ["5"]
