"""Hostile JSON bodies on every broker route that reads one: a 4xx with its code, never a 500.

Every route reads its body with ``broker.bodies.read_json_object``; each table row is sent to each
such route, as the identity that route serves (so the refusal is the body's, not the caller's).
The broker is one of its own (``isolated_broker``): if a generated body ever were a valid
revocation, it would revoke nothing another test relies on.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.bodies import MAX_BODY
from broker.openapi import OPENAPI
from contract.errors import Reason
from contract.strictjson import MAX_DEPTH
from tests.support.broker_stack import Broker

JSON_ROUTES = [pytest.param("/v1/runs", "runtime", id="runs"),
               pytest.param("/v1/revocations", "admin", id="revocations")]
GRANT = b'{"upstream":"slack","purpose":"post_message"'


def _nested(opening: bytes, closing: bytes, depth: int, inner: bytes = b'"x"') -> bytes:
    return opening * depth + inner + closing * depth


def _in_params(value: bytes) -> bytes:
    return b'{"grants":[' + GRANT + b',"params":{"channel":' + value + b"}}]}"


BODIES = [
    # depth, bounded before parsing: the 2,000-deep document was a RecursionError and a 500
    pytest.param(_in_params(_nested(b'{"a":', b"}", 2000)), 400, "json_too_deep", id="params-2000-objects"),
    pytest.param(_nested(b"[", b"]", MAX_BODY // 2 - 10), 400, "json_too_deep", id="arrays-to-the-size-cap"),
    pytest.param(_nested(b'{"a":', b"}", MAX_DEPTH + 1, b"1"), 400, "json_too_deep", id="one-past-max-depth"),
    pytest.param(_in_params(_nested(b"[", b"]", 5000)), 400, "json_too_deep", id="params-5000-arrays"),
    # a member name twice, at any depth, however spelled
    pytest.param(b'{"grants":[],"grants":[' + GRANT + b"}]}", 400, "duplicate_member", id="top-level"),
    pytest.param(b'{"grants":[{"upstream":"a","upstream":"slack","purpose":"post_message"}]}', 400,
                 "duplicate_member", id="in-grant"),
    pytest.param(_in_params(b'"a","channel":"b"'), 400, "duplicate_member", id="in-params"),
    pytest.param(b'{"grants":[' + GRANT + b'}],"gr\\u0061nts":[]}', 400, "duplicate_member",
                 id="escaped-name"),
    pytest.param(b'{"scope":"run","scope":"all","name":"x"}', 400, "duplicate_member", id="scope-twice"),
    # not UTF-8, or with a byte-order mark
    *[pytest.param(json.dumps({"grants": []}).encode(codec), 400, "invalid_json", id=codec)
      for codec in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-be", "utf-8-sig")],
    pytest.param(_in_params(b'"\xc0\xae"'), 400, "invalid_json", id="overlong-utf8"),
    pytest.param(_in_params(b'"\xff"'), 400, "invalid_json", id="invalid-utf8"),
    pytest.param(_in_params(b'"\xed\xa0\x80"'), 400, "invalid_json", id="utf8-encoded-surrogate"),
    pytest.param(_in_params(b'"\\ud800"'), 400, "invalid_json", id="lone-surrogate-escape"),
    # numbers
    pytest.param(b'{"grants":[],"ttl":NaN}', 400, "invalid_json", id="nan"),
    pytest.param(b'{"grants":[],"ttl":-Infinity}', 400, "invalid_json", id="minus-infinity"),
    pytest.param(b'{"grants":[],"ttl":1' + b"0" * 40 + b"}", 400, "invalid_json", id="huge-integer"),
    pytest.param(b'{"grants":[],"ttl":1' + b"0" * 5000 + b"}", 400, "invalid_json", id="5000-digits"),
    pytest.param(b'{"grants":[],"ttl":1e999}', 400, "invalid_json", id="float-overflow"),
    # not one JSON object
    *[pytest.param(raw, 400, "invalid_json", id=label)
      for label, raw in [("empty", b""), ("array", b"[]"), ("string", b'"x"'), ("null", b"null"),
                         ("number", b"1"), ("trailing-garbage", b"{}x"), ("two-objects", b"{}{}"),
                         ("single-quotes", b"{'grants':[]}"), ("trailing-comma", b'{"grants":[],}'),
                         ("not-json", b"{not json")]],
    pytest.param(b'"' + b'\\"' * (MAX_BODY // 2 - 1), 400, "invalid_json", id="64-KiB-unterminated-string"),
    # size, before parsing
    pytest.param(b'{"grants":"' + b"x" * MAX_BODY + b'"}', 413, "body_too_large", id="over-64-KiB"),
]


def _token(broker: Broker, identity: str) -> str:
    return broker.vault.admin_token if identity == "admin" else broker.vault.runtime_token("notifier")


@pytest.mark.parametrize(("route", "identity"), JSON_ROUTES)
@pytest.mark.parametrize(("raw", "status", "code"), BODIES)
def test_hostile_bodies(isolated_broker: Broker, route: str, identity: str, raw: bytes, status: int,
                        code: str) -> None:
    with isolated_broker.client(_token(isolated_broker, identity)) as client:
        response = client.post(route, content=raw, headers={"Content-Type": "application/json"})
    assert (response.status_code, response.json()["error"]) == (status, code), response.text


@pytest.fixture(scope="module")
def clients(isolated_broker: Broker) -> Any:
    runtime = isolated_broker.client(_token(isolated_broker, "runtime"))
    admin = isolated_broker.client(_token(isolated_broker, "admin"))
    with runtime, admin:
        yield {"/v1/runs": runtime, "/v1/revocations": admin}


ROUTE = st.sampled_from(["/v1/runs", "/v1/revocations"])
PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CODES = {r.value for r in Reason}


@PROPERTY
@given(route=ROUTE, raw=st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode)))
def test_any_bytes_get_a_4xx_with_a_code(clients: Any, route: str, raw: bytes) -> None:
    response: httpx.Response = clients[route].post(route, content=raw)
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["error"] in CODES


KEY = st.text(st.characters(codec="utf-8"), max_size=8)
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.text(max_size=20),
                   st.floats(allow_nan=False, allow_infinity=False))


def _values(depth: int) -> st.SearchStrategy[Any]:
    if depth == 0:
        return SCALAR
    inner = _values(depth - 1)
    return st.one_of(SCALAR, st.lists(inner, max_size=3), st.dictionaries(KEY, inner, max_size=3))


def _dump_with_duplicate(value: Any, target: int, counter: list[int]) -> str:
    """JSON text of ``value`` in which the ``target``-th non-empty object repeats its first member."""
    if isinstance(value, dict):
        parts = [f"{json.dumps(k)}:{_dump_with_duplicate(v, target, counter)}" for k, v in value.items()]
        if value:
            counter[0] += 1
            if counter[0] == target:
                first = next(iter(value))
                parts.append(f"{json.dumps(first)}:{json.dumps('again')}")
        return "{" + ",".join(parts) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dump_with_duplicate(v, target, counter) for v in value) + "]"
    return json.dumps(value)


@PROPERTY
@given(route=ROUTE, value=st.dictionaries(KEY, _values(4), min_size=1, max_size=4),
       pick=st.integers(1, 1000))
def test_a_duplicate_member_anywhere_is_refused(clients: Any, route: str, value: dict[str, Any],
                                                pick: int) -> None:
    objects = [0]
    _dump_with_duplicate(value, 0, objects)  # count the non-empty objects
    text = _dump_with_duplicate(value, pick % objects[0] + 1, [0])
    response: httpx.Response = clients[route].post(route, content=text.encode())
    assert (response.status_code, response.json()["error"]) == (400, "duplicate_member"), text


@PROPERTY
@given(route=ROUTE, value=st.dictionaries(KEY, _values(3), min_size=1, max_size=4),
       codec=st.sampled_from(["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-8-sig"]))
def test_any_object_not_in_utf8_is_refused(clients: Any, route: str, value: dict[str, Any],
                                           codec: str) -> None:
    raw = json.dumps(value).encode(codec)
    response: httpx.Response = clients[route].post(route, content=raw)
    assert (response.status_code, response.json()["error"]) == (400, "invalid_json")


def _undeclared(path: str) -> tuple[str, set[str]]:
    declared = {m.upper() for m in OPENAPI["paths"][path]}
    implicit = {"HEAD"} if "GET" in declared else set()  # Starlette answers HEAD for every GET route
    return next(m for m in ("PATCH", "PUT", "POST", "DELETE") if m not in declared), declared | implicit


@pytest.mark.parametrize("path", list(OPENAPI["paths"]))
def test_wrong_method_is_405_with_allow(isolated_broker: Broker, path: str) -> None:
    method, allowed = _undeclared(path)
    concrete = path.replace("{run_id}", "run_x").replace("{scope}", "runtime").replace("{name}", "x")
    with isolated_broker.client(isolated_broker.vault.admin_token) as client:
        response = client.request(method, concrete)
    assert (response.status_code, response.json()["error"]) == (405, "method_not_allowed")
    assert set(response.headers["allow"].split(", ")) == allowed
