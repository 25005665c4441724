"""OpenAPI 3.1 description of the broker API, served at /openapi.json."""

from __future__ import annotations

from typing import Any

_ERROR = {
    "type": "object",
    "required": ["error", "detail"],
    "properties": {"error": {"type": "string"}, "detail": {"type": "string"}},
}
_GRANT = {
    "type": "object",
    "required": ["upstream", "purpose"],
    "additionalProperties": False,
    "properties": {
        "upstream": {"type": "string"},
        "purpose": {"type": "string"},
        "params": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
_RUN = {
    "type": "object",
    "properties": {
        "run_id": {"type": "string"}, "runtime": {"type": "string"},
        "grants": {"type": "array", "items": {"type": "object"}},
        "created": {"type": "integer"}, "expires": {"type": "integer"},
        "state": {"type": "string", "enum": ["active", "ended"]},
    },
}
_BUNDLE = {
    "type": "object",
    "properties": {
        "run_id": {"type": "string"}, "runtime": {"type": "string"},
        "expires_at": {"type": "integer"}, "expires_in": {"type": "integer"},
        "grants": {"type": "array", "items": {"type": "object"}},
        "gateways": {"type": "object", "additionalProperties": {"type": "string"}},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        "dotenv": {"type": "string"},
    },
}


_REVOKE = {
    "type": "object", "required": ["scope"], "additionalProperties": False,
    "properties": {"scope": {"type": "string", "enum": ["run", "runtime", "upstream", "all"]},
                   "name": {"type": "string"}, "reason": {"type": "string"}},
}
_REVOCATION = {
    "type": "object",
    "properties": {"scope": {"type": "string"}, "name": {"type": "string"}, "who": {"type": "string"},
                   "why": {"type": "string"}, "when": {"type": "number"}, "not_before": {"type": "integer"},
                   "blocked": {"type": "boolean"}, "lifted_by": {"type": "string"},
                   "lifted_at": {"type": "number"}},
}


def _errors(*codes: int) -> dict[str, Any]:
    schema = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return {str(code): {"description": "refused", **schema} for code in codes}


def _ok(description: str, schema: dict[str, Any], status: str = "200") -> dict[str, Any]:
    return {status: {"description": description,
                     "content": {"application/json": {"schema": schema}}}}


_AUTH: list[dict[str, list[str]]] = [{"vaultToken": []}, {"bearerVaultToken": []}]
_RUN_ID = [{"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}}]

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "valetkey broker", "version": "1"},
    "components": {
        "schemas": {"Error": _ERROR, "Grant": _GRANT, "Run": _RUN, "RunBundle": _BUNDLE},
        "securitySchemes": {
            "vaultToken": {"type": "apiKey", "in": "header", "name": "X-Vault-Token"},
            "bearerVaultToken": {"type": "http", "scheme": "bearer"},
        },
    },
    "paths": {
        "/v1/runs": {"post": {
            "summary": "Mint a run: one token per upstream granted, returned as a run bundle",
            "security": _AUTH,
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "required": ["grants"], "additionalProperties": False,
                "properties": {
                    "grants": {"type": "array", "items": {"$ref": "#/components/schemas/Grant"}},
                    "ttl": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
                }}}}},
            "responses": {**_ok("run bundle", {"$ref": "#/components/schemas/RunBundle"}, "201"),
                          **_errors(400, 401, 403, 413, 503)},
        }},
        "/v1/runs/{run_id}": {
            "get": {"summary": "Read a run", "security": _AUTH, "parameters": _RUN_ID,
                    "responses": {**_ok("run", {"$ref": "#/components/schemas/Run"}),
                                  **_errors(401, 404)}},
            "delete": {"summary": "End a run; its tokens stop verifying", "security": _AUTH,
                       "parameters": _RUN_ID,
                       "responses": {**_ok("ended run", {"$ref": "#/components/schemas/Run"}),
                                     **_errors(401, 404)}},
        },
        "/v1/runs/{run_id}/audit": {"get": {
            "summary": "The run's audit trail, newest first (security team)", "security": _AUTH,
            "parameters": [*_RUN_ID, {"name": "limit", "in": "query", "schema": {"type": "integer"}}],
            "responses": {**_ok("entries", {"type": "object"}), **_errors(401, 403, 503)}}},
        "/v1/revocations": {
            "post": {"summary": "Revoke a run, a runtime, an upstream or everything (security team)",
                     "security": _AUTH,
                     "requestBody": {"required": True, "content": {"application/json": {"schema": _REVOKE}}},
                     "responses": {**_ok("revocation", _REVOCATION, "201"), **_errors(400, 401, 403, 404)}},
            "get": {"summary": "Every recorded revocation (security team)", "security": _AUTH,
                    "responses": {**_ok("revocations", {"type": "object"}), **_errors(401, 403)}},
        },
        "/v1/revocations/{scope}/{name}": {"delete": {
            "summary": "Lift a standing runtime or upstream revocation (security team); 404 "
                       "revocation_not_found if none stands, unknown_revocation_target if not in policy",
            "security": _AUTH,
            "parameters": [{"name": "scope", "in": "path", "required": True,
                            "schema": {"type": "string", "enum": ["runtime", "upstream"]}},
                           {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {**_ok("lifted", _REVOCATION), **_errors(400, 401, 403, 404)}}},
        "/v1/revocations/all": {"delete": {
            "summary": "Lift the standing global revocation (security team); 404 revocation_not_found "
                       "if none stands", "security": _AUTH,
            "responses": {**_ok("lifted", _REVOCATION), **_errors(401, 403, 404)}}},
        "/.well-known/jwks.json": {"get": {
            "summary": "Public keys of every live signing-key version",
            "responses": _ok("JWKS", {"type": "object"})}},
        "/healthz": {"get": {"summary": "Process is up", "responses": _ok("ok", {"type": "object"})}},
        "/readyz": {"get": {"summary": "Vault and Redis reachable",
                            "responses": {**_ok("ready", {"type": "object"}), **_errors(503)}}},
    },
}
