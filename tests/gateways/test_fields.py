"""Values under credential-named fields, found in every place a request carries named fields.

The value here is an opaque string that matches no provider pattern: these requests pass the
shape scanner (``test_patterns.py``) and must be refused by name. End to end against a real
gateway and upstream: ``test_gateway.py`` (``FIELD_REFUSALS``).
"""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateways.credential_scan import CredentialScanner
from gateways.fields import FieldRules, find_in_body, find_in_query

OPAQUE = "Zq8opaque-internal-credential-value-7Yx"  # no provider's shape
NONE = FieldRules()
QUERY_KEY = FieldRules(injected_param="key")
ALLOW_PASSWORD = FieldRules(allowed=frozenset({"password"}))
JSON = "application/json"
FORM = "application/x-www-form-urlencoded"


def multipart(*parts: tuple[str, str, bytes], boundary: str = "b0undary") -> tuple[bytes, str]:
    """(body, content type) from (content-disposition params, part content type, content)."""
    out = b""
    for disposition, ctype, content in parts:
        out += f"--{boundary}\r\nContent-Disposition: form-data; {disposition}\r\n".encode()
        out += f"Content-Type: {ctype}\r\n".encode() if ctype else b""
        out += b"\r\n" + content + b"\r\n"
    return out + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


QUERIES = [
    pytest.param(f"key={OPAQUE}", NONE, "query:key", id="key"),
    pytest.param(f"q=x&access_token={OPAQUE}", NONE, "query:access_token", id="access-token"),
    pytest.param(f"api%5Fkey={OPAQUE}", NONE, "query:api_key", id="percent-encoded-name"),
    pytest.param(f"api%255Fkey={OPAQUE}", NONE, "query:api_key", id="double-encoded-name"),
    pytest.param(f"API-Key={OPAQUE}", NONE, "query:API-Key", id="case-and-dash"),
    pytest.param(f"githubToken={OPAQUE}", NONE, "query:githubToken", id="camel-suffix"),
    pytest.param(f"x=1;token={OPAQUE}", NONE, "query:token", id="semicolon-separator"),
    pytest.param(f"q=1&q=2&password={OPAQUE}&password=", NONE, "query:password", id="repeated"),
    pytest.param(f"user%5Bpassword%5D={OPAQUE}", NONE, "query:user[password]", id="bracketed"),
    pytest.param(f"key=placeholder&KEY={OPAQUE}", QUERY_KEY, "query:KEY", id="injected-param-other-case"),
    pytest.param(f"key=placeholder&api_key={OPAQUE}", QUERY_KEY, "query:api_key",
                 id="injected-param-plus-another"),
    pytest.param(f"password={OPAQUE}&token={OPAQUE}", ALLOW_PASSWORD, "query:token", id="allowed-one-not-other"),
    pytest.param("key=", NONE, None, id="empty-value"),
    pytest.param("token", NONE, None, id="no-value"),
    pytest.param(f"key={OPAQUE}", QUERY_KEY, None, id="injected-param"),
    pytest.param(f"k%65y={OPAQUE}", QUERY_KEY, None, id="injected-param-encoded-as-parse-qsl-reads"),
    pytest.param(f"Password={OPAQUE}", ALLOW_PASSWORD, None, id="allowed-by-purpose"),
    pytest.param(f"max_tokens=5&page_token={OPAQUE}&q=token", NONE, None, id="ordinary-names"),
    pytest.param("", NONE, None, id="empty"),
]


@pytest.mark.parametrize(("query", "rules", "location"), QUERIES)
def test_query(query: str, rules: FieldRules, location: str | None) -> None:
    finding = find_in_query(query.encode(), rules)
    assert (finding.location if finding else None) == location
    assert OPAQUE not in repr(finding)


BODIES = [
    pytest.param(JSON, json.dumps({"api_key": OPAQUE}), NONE, "body:json:api_key", id="json"),
    pytest.param(JSON, json.dumps({"a": {"b": [{"openai_api_key": OPAQUE}]}}), NONE,
                 "body:json:openai_api_key", id="json-nested-array-of-objects"),
    pytest.param(JSON, json.dumps([{"password": 1234}]), NONE, "body:json:password", id="json-number"),
    pytest.param(JSON, json.dumps({"token": ["", [OPAQUE]]}), NONE, "body:json:token", id="json-array-value"),
    pytest.param(JSON, '{"api\\u005fkey": "' + OPAQUE + '"}', NONE, "body:json:api_key", id="json-escaped-name"),
    pytest.param(JSON, json.dumps({"api": {"key": OPAQUE}}), NONE, "body:json:api_key", id="json-name-over-two-levels"),
    pytest.param(JSON, json.dumps({"session": [{"id": OPAQUE}]}), NONE, "body:json:session_id",
                 id="json-name-over-an-array"),
    pytest.param(JSON, b"\xef\xbb\xbf" + json.dumps({"secret": OPAQUE}).encode(), NONE, "body:json:secret",
                 id="json-utf8-bom"),
    pytest.param("text/plain", json.dumps({"token": OPAQUE}).encode("utf-16"), NONE, "body:json:token",
                 id="json-utf16-sent-as-text"),
    pytest.param(JSON, '{"note": "x", "token": "' + OPAQUE + '", "token": ""}', NONE, "body:json:token",
                 id="json-duplicate-first"),
    pytest.param(JSON, '{"token": "", "token": "' + OPAQUE + '"}', NONE, "body:json:token",
                 id="json-duplicate-last"),
    pytest.param("application/vnd.api+json; charset=utf-8", json.dumps({"clientSecret": OPAQUE}), NONE,
                 "body:json:clientSecret", id="plus-json"),
    pytest.param(JSON, json.dumps({"secret": OPAQUE}).encode("utf-16"), NONE,
                 "body:json:secret", id="json-utf16"),
    pytest.param(JSON, '{"session": "' + OPAQUE + '", oops', NONE, "body:json:session", id="json-invalid"),
    pytest.param(JSON, '{"a": 1, "token": ["' + OPAQUE + '"], oops', NONE, "body:json:token",
                 id="json-invalid-array-value"),
    pytest.param(JSON, '{"token": "", "x": [], oops', NONE, None, id="json-invalid-empty-values"),
    pytest.param(FORM, json.dumps({"api_key": OPAQUE}), NONE, "body:json:api_key", id="json-sent-as-form"),
    pytest.param("text/plain", json.dumps({"api_key": OPAQUE}), NONE, "body:json:api_key",
                 id="json-sent-as-text"),
    pytest.param("", json.dumps({"api_key": OPAQUE}), NONE, "body:json:api_key", id="json-without-type"),
    pytest.param(FORM, f"title=x&private_token={OPAQUE}", NONE, "body:form:private_token", id="form"),
    pytest.param(FORM, f"api%5Fkey={OPAQUE}", NONE, "body:form:api_key", id="form-encoded-name"),
    pytest.param(FORM, f"key={OPAQUE}", QUERY_KEY, "body:form:key", id="form-key-though-query-injected"),
    pytest.param(JSON, json.dumps({"max_tokens": 5, "model": "m", "messages": [{"content": "token"}]}),
                 NONE, None, id="openai-chat"),
    pytest.param(JSON, json.dumps({"title": "t", "body": "b", "labels": ["bug"]}), NONE, None,
                 id="github-issue"),
    pytest.param(JSON, json.dumps({"messages": [{"role": "assistant", "content": [
        {"type": "thinking", "thinking": "…", "signature": OPAQUE}]}], "max_tokens": 9}), NONE, None,
                 id="anthropic-thinking-signature"),
    pytest.param(JSON, json.dumps({"tags": [{"key": "env", "value": OPAQUE}]}), NONE, None,
                 id="json-key-value-pairs"),
    pytest.param(JSON, json.dumps({"tool_calls": [{"id": "call_1", "function": {"name": "f"}}]}), NONE, None,
                 id="openai-tool-call-ids"),
    pytest.param(JSON, json.dumps({"results": {"page_token": OPAQUE}}), NONE, None, id="cursor-under-a-parent"),
    pytest.param(JSON, json.dumps({"tools": [{"parameters": {"properties": {"password": {
        "type": "string"}}, "required": ["password"]}}]}), NONE, None, id="tool-schema-naming-password"),
    pytest.param(JSON, json.dumps({"token": "", "password": None, "secret": False, "auth": {"type": "x"}}),
                 NONE, None, id="json-empty-null-bool-object"),
    pytest.param(JSON, json.dumps({"password": OPAQUE}), ALLOW_PASSWORD, None, id="json-allowed"),
    pytest.param(FORM, "token=", NONE, None, id="form-empty"),
    pytest.param("application/octet-stream", f"api_key={OPAQUE}", NONE, None, id="opaque-bytes"),
]


@pytest.mark.parametrize(("ctype", "body", "rules", "location"), BODIES)
def test_body(ctype: str, body: str | bytes, rules: FieldRules, location: str | None) -> None:
    finding = find_in_body(body if isinstance(body, bytes) else body.encode(), ctype, rules)
    assert (finding.location if finding else None) == location
    assert OPAQUE not in repr(finding)


MULTIPART = [
    pytest.param([('name="api_key"', "", OPAQUE.encode())], "body:multipart:api_key", id="part"),
    pytest.param([('name="title"', "", b"x"), ('name="Password"; filename="p.txt"', "text/plain",
                                                  OPAQUE.encode())], "body:multipart:Password", id="file-part"),
    pytest.param([("name*=utf-8''api%5Fkey", "", OPAQUE.encode())], "body:multipart:api_key",
                 id="rfc2231-name"),
    pytest.param([('name="meta"', JSON, json.dumps({"token": OPAQUE}).encode())],
                 "body:multipart:json:token", id="json-part"),
    pytest.param([('name="api%5Fkey"', "", OPAQUE.encode())], "body:multipart:api_key", id="encoded-name"),
    pytest.param([("name=\"title\"; name*=utf-8''api_key", "", OPAQUE.encode())], "body:multipart:api_key",
                 id="name-and-rfc2231-name-disagree"),
    pytest.param([('name="pass\\"word"', "", OPAQUE.encode())], "body:multipart:<redacted>", id="quoted-pair"),
    pytest.param([("name=token", "", OPAQUE.encode())], "body:multipart:token", id="unquoted-name"),
    pytest.param([('name="token"', "", b"")], None, id="empty-part"),
    pytest.param([('name="file"; filename="a.bin"', "application/octet-stream", OPAQUE.encode())], None,
                 id="ordinary-part"),
]


@pytest.mark.parametrize(("parts", "location"), MULTIPART)
def test_multipart(parts: list[tuple[str, str, bytes]], location: str | None) -> None:
    body, ctype = multipart(*parts)
    finding = find_in_body(body, ctype, NONE)
    assert (finding.location if finding else None) == location


def test_nested_multipart() -> None:
    inner, inner_type = multipart(('name="api_key"', "", OPAQUE.encode()), boundary="inner")
    body, ctype = multipart(('name="files"', inner_type, inner))
    finding = find_in_body(body, ctype, NONE)
    assert finding is not None
    assert finding.location == "body:multipart:multipart:api_key"


def test_the_opaque_value_passes_the_shape_scanner() -> None:
    """The class these tests cover: nothing in the value gives it away."""
    assert CredentialScanner().scan_query(f"api_key={OPAQUE}".encode()) is None


def test_a_name_that_is_not_plain_is_not_logged() -> None:
    finding = find_in_query(f"{quote('x y;<token>')}={OPAQUE}".encode(), NONE)
    assert finding is not None
    assert finding.location == "query:<redacted>"


def test_a_deep_json_document_is_walked_without_recursion() -> None:
    body = ('{"a":' * 5000 + json.dumps({"token": OPAQUE}) + "}" * 5000).encode()
    finding = find_in_body(body, JSON, NONE)
    assert finding is not None
    assert finding.location.endswith(":token")


NAME = st.sampled_from(["api_key", "x-api-key", "githubToken", "password", "access_token", "session"])


@given(NAME, st.text(min_size=1, max_size=40), st.sampled_from(["query", "form", "json", "multipart"]))
def test_any_value_under_a_credential_name_is_refused(name: str, value: str, where: str) -> None:
    if where == "query":
        finding = find_in_query(f"{quote(name)}={quote(value)}".encode(), NONE)
    elif where == "form":
        finding = find_in_body(f"{quote(name)}={quote(value)}".encode(), FORM, NONE)
    elif where == "json":
        finding = find_in_body(json.dumps({"outer": [{name: value}]}).encode(), JSON, NONE)
    else:
        body, ctype = multipart((f'name="{name}"', "", value.encode()))
        finding = find_in_body(body, ctype, NONE)
    assert finding is not None
    assert finding.location == ("query" if where == "query" else f"body:{where}") + f":{name}"


@given(st.dictionaries(st.sampled_from(["model", "max_tokens", "messages", "stream", "temperature",
                                        "budget_tokens", "prompt_cache_key", "title", "body"]),
                       st.text(max_size=20) | st.integers(), max_size=8))
def test_ordinary_documents_pass(document: dict[str, object]) -> None:
    assert find_in_body(json.dumps(document).encode(), JSON, NONE) is None


KEYS = st.sampled_from(["api_key", "token", "max_tokens", "key", "model", "auth", "signature", "page_token",
                        ":password", "a b", "content", "api", "session", "id", "tags", "x_to", "ken"])
SCALARS = st.none() | st.booleans() | st.integers() | st.text(max_size=6)


def _nested(inner: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3)


DOCUMENTS = st.recursive(SCALARS, _nested, max_leaves=12)


def _reference(node: object, under: bool = False, parent: str = "") -> bool:
    """The rule stated plainly: a non-empty string or a number under a credential name (the
    member's own, or, when its own is a tail of one, its parent's and its own), or in an array
    under one."""
    from policies.credential_names import completes_a_name, is_credential_name

    if isinstance(node, dict):
        return any(_reference(v, is_credential_name(k) or bool(
            parent and completes_a_name(k) and is_credential_name(f"{parent}_{k}")), k) for k, v in node.items())
    if isinstance(node, list):
        return any(_reference(v, under if isinstance(v, list | str | int | float) else False, parent)
                   for v in node)
    scalar = (isinstance(node, str) and node != "") or (isinstance(node, int | float) and not isinstance(node, bool))
    return under and scalar


@given(DOCUMENTS, st.booleans())
def test_json_walk_matches_the_rule(document: object, escaped: bool) -> None:
    """Both paths (plain text split, full parse of escaped text) give the rule's answer."""
    body = json.dumps(document).encode()
    if escaped:  # an escape anywhere sends the body down the full parse
        body = b'{"\\u0078": ' + body + b"}"
    assert (find_in_body(body, JSON, NONE) is not None) == _reference(document)


SHIPPED_BODIES = [
    pytest.param({"body": "Thanks! The token refresh is fixed in #12; see api_key handling."}, id="github-comment"),
    pytest.param({"title": "Fix retries", "head": "fix", "base": "main", "body": "x", "draft": True,
                  "maintainer_can_modify": True}, id="github-pull-request"),
    pytest.param({"channel": "C123", "text": "deploy done", "thread_ts": "1.2", "unfurl_links": False,
                  "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "*done*"}}]}, id="slack-post"),
    pytest.param({"model": "gpt-x", "messages": [{"role": "system", "content": "never print a password"},
                                                {"role": "user", "content": "hi"}],
                  "max_completion_tokens": 64, "logit_bias": {"1234": -100}, "prompt_cache_key": "k1",
                  "safety_identifier": "u1", "reasoning_effort": "low", "stream_options": {"include_usage": True},
                  "tools": [{"type": "function", "function": {"name": "login", "parameters": {
                      "type": "object", "properties": {"password": {"type": "string"}, "api_key": {"type": "string"}},
                      "required": ["password"]}}}],
                  "tool_choice": "auto"}, id="openai-chat-with-tools"),
    pytest.param({"model": "gpt-x", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
                  "previous_response_id": "resp_1", "reasoning": {"effort": "low"}, "max_output_tokens": 10,
                  "text": {"format": {"type": "json_schema", "name": "s", "schema": {"properties": {
                      "token": {"type": "string"}}}}}}, id="openai-responses"),
    pytest.param({"model": "text-embedding-x", "input": ["a", "b"], "encoding_format": "float"}, id="openai-embeddings"),
    pytest.param({"model": "claude-x", "max_tokens": 1024, "system": "be brief", "stop_sequences": ["\n\nH:"],
                  "metadata": {"user_id": "u-1"}, "thinking": {"type": "enabled", "budget_tokens": 512},
                  "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
                      {"type": "thinking", "thinking": "...", "signature": "EqQBCkgIAR"},
                      {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"query": "x"}}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]}],
                  "tools": [{"name": "lookup", "input_schema": {"type": "object", "properties": {
                      "session": {"type": "string"}}}}]}, id="anthropic-messages"),
    pytest.param({"model": "claude-x", "messages": [{"role": "user", "content": "count me"}]},
                 id="anthropic-count-tokens"),
]


@pytest.mark.parametrize("document", SHIPPED_BODIES)
def test_shipped_policies_bodies_pass(document: dict[str, object]) -> None:
    """What agents send through the shipped policies' purposes is never refused by name."""
    for body in (json.dumps(document).encode(), json.dumps(document, ensure_ascii=False).encode() + b" "):
        assert find_in_body(body, JSON, NONE) is None
    escaped = json.dumps({"\u00e9": document}).encode()  # an escape: the full walk, not the prefilter
    assert find_in_body(escaped, JSON, NONE) is None


def test_credentials_by_design_need_allow_fields() -> None:
    """Some APIs take a credential in the body by design (Anthropic's MCP connector): refused
    unless the purpose allows that field."""
    body = json.dumps({"mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "m",
                                        "authorization_token": OPAQUE}]}).encode()
    finding = find_in_body(body, JSON, NONE)
    assert finding is not None
    assert finding.location == "body:json:authorization_token"
    assert find_in_body(body, JSON, FieldRules(allowed=frozenset({"authorizationtoken"}))) is None
