"""OpenAPI 3.1 description of the broker API, served at /openapi.json.

It says what the broker enforces, no more and no less: request schemas refuse what the handlers
refuse (``additionalProperties: false`` where an unknown member is a 400, bounds where a value out
of them is a 400), and each operation lists every status it can answer. Policy decides the rest
(which upstreams, purposes and params exist), so a body valid here may still be refused.
``tests/broker/test_openapi_fuzz.py`` fuzzes the live broker from this document.
"""

from __future__ import annotations

from typing import Any

from broker.bodies import MAX_BODY
from broker.grants import MAX_GRANTS
from contract.errors import Reason

MAX_AUDIT_LIMIT = 5000
DEFAULT_AUDIT_LIMIT = 500

_ERROR = {
    "type": "object",
    "required": ["error", "detail"],
    "properties": {"error": {"type": "string", "enum": [r.value for r in Reason]},
                   "detail": {"type": "string"},
                   "recorded": {"type": "boolean", "description": "revocations and lifts: false on a 503"},
                   "retry_after": {"type": "integer", "description": "broker_overloaded: seconds"}},
}
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_GRANT = {
    "type": "object",
    "description": "names an upstream or a destination: `upstream`, or its synonym `destination` "
                   "(exactly one of the two); destinations need a broker with VALETKEY_PROXY_URL",
    "required": ["purpose"],
    "oneOf": [{"required": ["upstream"]}, {"required": ["destination"]}],
    "additionalProperties": False,
    "properties": {
        "upstream": {"type": "string"},
        "destination": {"type": "string"},
        "purpose": {"type": "string", "description": "`connect` for a tunnel destination"},
        "params": {**_STRINGS, "description": "each value one path segment of [A-Za-z0-9._~@+-], "
                   "1-200 characters, not '.' or '..' (else 400 param_widens_template)"},
    },
}
_GRANT_RECORD = {  # a grant as the broker records it: params always present
    "type": "object", "required": ["upstream", "purpose", "params"],
    "properties": {"upstream": {"type": "string"}, "purpose": {"type": "string"}, "params": _STRINGS},
}
# policies/units.py parse_duration: digits, an optional unit, ASCII blanks around (ECMA's \s is wider)
_DURATION = r"^[ \t\n\r\f\v]*[0-9]+[ \t\n\r\f\v]*[smhd]?[ \t\n\r\f\v]*$"
_RUN_REQUEST = {
    "type": "object", "required": ["grants"], "additionalProperties": False,
    "description": f"UTF-8 JSON, at most {MAX_BODY} bytes, no member name twice in an object",
    "properties": {
        "grants": {"type": "array", "minItems": 1, "maxItems": MAX_GRANTS,
                   "items": {"$ref": "#/components/schemas/Grant"},
                   "description": "at most the runtime's max_grants (else 400 too_many_grants)"},
        "ttl": {"description": "seconds, or a duration such as 15m; null or absent: the default; "
                               "at most the runtime's max_ttl (else 400 ttl_too_long)",
                "oneOf": [{"type": "integer", "minimum": 1},
                          {"type": "string", "pattern": _DURATION}, {"type": "null"}]},
    },
}
_RUN = {
    "type": "object",
    "required": ["run_id", "runtime", "grants", "created", "expires", "state", "ended_at", "ended_by",
                 "audiences", "vault_accessors"],
    "additionalProperties": False,
    "properties": {
        "run_id": {"type": "string"}, "runtime": {"type": "string"},
        "grants": {"type": "array", "items": _GRANT_RECORD},
        "created": {"type": "integer"}, "expires": {"type": "integer"},
        "state": {"type": "string", "enum": ["active", "ended"]},
        "ended_at": {"type": ["integer", "null"]}, "ended_by": {"type": ["string", "null"]},
        "audiences": {"type": "array", "items": {"type": "string"}},
        "vault_accessors": {"type": "array", "items": {"type": "string"}},
    },
}
_BUNDLE = {
    "type": "object",
    "required": ["run_id", "runtime", "expires_at", "expires_in", "grants", "gateways", "env", "dotenv",
                 "files"],
    "additionalProperties": False,
    "properties": {
        "run_id": {"type": "string"}, "runtime": {"type": "string"},
        "expires_at": {"type": "integer"}, "expires_in": {"type": "integer"},
        "grants": {"type": "array", "items": _GRANT_RECORD},
        "gateways": _STRINGS, "env": _STRINGS, "dotenv": {"type": "string"},
        "files": {**_STRINGS, "description": "absolute path in the sandbox → content; with an egress "
                  "proxy, the CA file (VALETKEY_SANDBOX_CA_PATH) the env's CA variables name"},
    },
}
_REASON = {"type": "string", "description": "why; at most 500 characters are kept"}
_REVOKE = {
    "description": f"UTF-8 JSON, at most {MAX_BODY} bytes, no member name twice in an object",
    "oneOf": [
        {"type": "object", "required": ["scope", "name"], "additionalProperties": False,
         "properties": {"scope": {"type": "string", "enum": ["run", "runtime", "upstream"]},
                        "name": {"type": "string", "minLength": 1}, "reason": _REASON}},
        {"type": "object", "required": ["scope"], "additionalProperties": False,
         "properties": {"scope": {"const": "all"}, "name": {"const": ""}, "reason": _REASON}},
    ],
}
_REVOCATION = {
    "type": "object",
    "required": ["scope", "name", "who", "why", "when", "not_before", "blocked", "lifted_by", "lifted_at"],
    "additionalProperties": False,
    "properties": {"scope": {"type": "string", "enum": ["run", "runtime", "upstream", "all"]},
                   "name": {"type": "string"}, "who": {"type": "string"},
                   "why": {"type": "string"}, "when": {"type": "number"}, "not_before": {"type": "integer"},
                   "blocked": {"type": "boolean"}, "lifted_by": {"type": "string"},
                   "lifted_at": {"type": "number"}, "recorded": {"type": "boolean"}},
}
_AUDIT = {
    "type": "object", "required": ["run_id", "entries"], "additionalProperties": False,
    "properties": {"run_id": {"type": "string"}, "entries": {"type": "array", "items": {
        "type": "object", "required": ["id", "kind", "line"],
        "properties": {"id": {"type": "string"}, "kind": {"type": "string"}, "line": {"type": "object"}},
    }}},
}
_JWKS = {
    "type": "object", "required": ["keys"],
    "properties": {"keys": {"type": "array", "items": {
        "type": "object", "required": ["kty", "crv", "x", "kid"],
        "properties": {"kty": {"const": "OKP"}, "crv": {"const": "Ed25519"}, "x": {"type": "string"},
                       "kid": {"type": "string"}, "use": {"const": "sig"}, "alg": {"const": "Ed25519"}},
    }}},
}
_READY = {
    "type": "object", "required": ["status", "checks"],
    "properties": {"status": {"enum": ["ready", "not_ready"]}, "error": {"const": "not_ready"},
                   "checks": {"type": "object", "additionalProperties": {"type": "boolean"}}},
}

_WHY = {
    400: "malformed request (reason code in `error`)",
    401: "no caller token, or Vault does not know it, or it matches no runtime and is not the "
         "security team",
    403: "caller known, action not allowed",
    404: "no such run, revocation or policy entry (another runtime's runs are not found either)",
    413: f"body over {MAX_BODY} bytes",
    502: "Vault answered but refused or gave an unusable answer",
    503: "Vault or Redis unavailable: nothing is done (fail closed)",
}
_DEPENDENCIES = (502, 503)  # every /v1/ route asks Vault who the caller is


def _errors(*codes: int) -> dict[str, Any]:
    schema = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return {str(code): {"description": _WHY[code], **schema} for code in (*codes, *_DEPENDENCIES)}


def _ok(description: str, schema: dict[str, Any], status: str = "200") -> dict[str, Any]:
    return {status: {"description": description,
                     "content": {"application/json": {"schema": schema}}}}


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


_AUTH: list[dict[str, list[str]]] = [{"vaultToken": []}, {"bearerVaultToken": []}]
_RUN_ID = [{"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}}]
_LIMIT = {"name": "limit", "in": "query", "required": False,
          "schema": {"type": "integer", "minimum": 1, "maximum": MAX_AUDIT_LIMIT,
                     "default": DEFAULT_AUDIT_LIMIT}}
_SCOPE = {"name": "scope", "in": "path", "required": True,
          "schema": {"type": "string", "enum": ["runtime", "upstream"]}}
_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
_ref = {name: {"$ref": f"#/components/schemas/{name}"} for name in ("Run", "RunBundle", "Revocation")}

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "valetkey broker", "version": "1"},
    "components": {
        "schemas": {"Error": _ERROR, "Grant": _GRANT, "RunRequest": _RUN_REQUEST, "Run": _RUN,
                    "RunBundle": _BUNDLE, "Revocation": _REVOCATION},
        "securitySchemes": {
            "vaultToken": {"type": "apiKey", "in": "header", "name": "X-Vault-Token"},
            "bearerVaultToken": {"type": "http", "scheme": "bearer"},
        },
    },
    "paths": {
        "/v1/runs": {"post": {
            "summary": "Mint a run: one token per upstream granted, returned as a run bundle",
            "security": _AUTH,
            "requestBody": _body({"$ref": "#/components/schemas/RunRequest"}),
            "responses": {**_ok("run bundle", _ref["RunBundle"], "201"),
                          **_errors(400, 401, 403, 413)},
        }},
        "/v1/runs/{run_id}": {
            "get": {"summary": "Read a run", "security": _AUTH, "parameters": _RUN_ID,
                    "responses": {**_ok("run", _ref["Run"]), **_errors(401, 404)}},
            "delete": {"summary": "End a run; its tokens stop verifying", "security": _AUTH,
                       "parameters": _RUN_ID,
                       "responses": {**_ok("ended run", _ref["Run"]), **_errors(401, 404)}},
        },
        "/v1/runs/{run_id}/audit": {"get": {
            "summary": "The run's audit trail, newest first (security team)", "security": _AUTH,
            "parameters": [*_RUN_ID, _LIMIT],
            "responses": {**_ok("entries", _AUDIT), **_errors(400, 401, 403)}}},
        "/v1/revocations": {
            "post": {"summary": "Revoke a run, a runtime, an upstream or everything (security team)",
                     "security": _AUTH, "requestBody": _body(_REVOKE),
                     "responses": {**_ok("revocation", _ref["Revocation"], "201"),
                                   **_errors(400, 401, 403, 404, 413, 503)}},
            "get": {"summary": "Every recorded revocation (security team)", "security": _AUTH,
                    "responses": {**_ok("revocations", {
                        "type": "object", "required": ["revocations"], "additionalProperties": False,
                        "properties": {"revocations": {"type": "array", "items": _ref["Revocation"]}}}),
                        **_errors(401, 403)}},
        },
        "/v1/revocations/{scope}/{name}": {"delete": {
            "summary": "Lift a standing runtime or upstream revocation (security team); 404 "
                       "revocation_not_found if none stands, unknown_revocation_target if not in policy",
            "security": _AUTH,
            "parameters": [{"name": "scope", "in": "path", "required": True,
                            "schema": {"type": "string", "enum": ["runtime", "upstream"]}},
                           {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {**_ok("lifted", _ref["Revocation"]), **_errors(400, 401, 403, 404, 503)}}},
        "/v1/revocations/all": {"delete": {
            "summary": "Lift the standing global revocation (security team); 404 revocation_not_found "
                       "if none stands", "security": _AUTH,
            "responses": {**_ok("lifted", _ref["Revocation"]), **_errors(401, 403, 404, 503)}}},
        "/.well-known/jwks.json": {"get": {
            "summary": "Public keys of every live signing-key version",
            "responses": {**_ok("JWKS", _JWKS), **_errors()}}},
        "/openapi.json": {"get": {"summary": "This document",
                                  "responses": _ok("OpenAPI 3.1", {"type": "object"})}},
        "/healthz": {"get": {"summary": "Process is up", "responses": _ok("ok", {
            "type": "object", "required": ["status"], "properties": {"status": {"const": "ok"}}})}},
        "/readyz": {"get": {"summary": "Vault, the broker's Vault token and Redis answer",
                            "responses": {**_ok("ready", _READY),
                                          "503": {"description": "not ready", "content": {
                                              "application/json": {"schema": _READY}}}}}},
    },
}
