"""The security team's routes: revoke and lift, list revocations, read a run's audit trail.

    POST   /v1/revocations                   {"scope": "run|runtime|upstream|all", "name", "reason"}
    GET    /v1/revocations                   every recorded revocation
    DELETE /v1/revocations/{scope}/{name}    lift a standing runtime or upstream revocation
    DELETE /v1/revocations/all               lift the standing global revocation

A lift of what does not stand is ``404 revocation_not_found`` and writes nothing; revoking or
lifting a runtime or upstream that is not in policy is ``404 unknown_revocation_target``.
    GET    /v1/runs/{run_id}/audit           the run's audit lines (newest first)

Every route needs the admin identity (the Vault policy named in settings). A revocation is
recorded with who, when and why, and is itself an audit event.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from broker import auditlog
from broker.errors import BadRequest, NotFound, Reason, ValetkeyError
from broker.revocations import Revocation, Scope, in_policy, new_revocation

if TYPE_CHECKING:
    from broker.app import Services
    from broker.callers import Caller
    from broker.runs import RunRecord

log = logging.getLogger("valetkey.broker")


async def _admin(request: Request) -> tuple[Caller, Services]:
    from broker.app import authenticate, services

    caller = await authenticate(request)
    caller.require_admin()
    return caller, services(request)


async def end_run_artifacts(svc: Services, record: RunRecord, who: str, why: str) -> Revocation:
    """Revoke the run's tokens everywhere and every Vault token or lease created for it."""
    revocation = await svc.revocations.revoke(
        new_revocation(Scope.RUN, record.run_id, who, why, run_expires=record.expires)
    )
    for accessor in record.vault_accessors:
        try:
            await svc.vault.revoke_accessor(accessor)
        except ValetkeyError as exc:  # the run is revoked either way; say what was left behind
            log.warning('{"event":"vault_revoke_failed","run":"%s","reason":"%s"}', record.run_id, exc.code)
    await record_event(svc, revocation, "revoke")
    return revocation


async def record_event(svc: Services, revocation: Revocation, action: str) -> None:
    line: dict[str, Any] = {"event": action, "scope": revocation.scope.value, "name": revocation.name,
                            "who": revocation.lifted_by if action == "lift" else revocation.who,
                            "why": revocation.why, "time": revocation.lifted_at or revocation.when}
    if revocation.scope is Scope.RUN:
        line["run"] = revocation.name
    elif revocation.scope is Scope.RUNTIME:
        line["runtime"] = revocation.name
    log.info(json.dumps(line, sort_keys=True))
    await auditlog.append(svc.redis, line, kind="revocation", maxlen=svc.settings.audit_maxlen)


async def revoke(request: Request) -> Response:
    from broker.app import read_json

    caller, svc = await _admin(request)
    body = await read_json(request)
    if not isinstance(body, dict) or set(body) - {"scope", "name", "reason"}:
        raise BadRequest("body must be {scope, name, reason}")
    try:
        scope = Scope(str(body.get("scope")))
    except ValueError:
        raise BadRequest("scope must be run, runtime, upstream or all") from None
    name, why = str(body.get("name") or ""), str(body.get("reason") or "revoked by the security team")
    if scope is Scope.RUN:
        record = await svc.runs.get(name)
        if record is None:  # unknown here (expired, or Redis lost it): revoke the id all the same
            revocation = await svc.revocations.revoke(new_revocation(scope, name, caller.name, why))
            await record_event(svc, revocation, "revoke")
        else:
            revocation = await end_run_artifacts(svc, record, caller.name, why)
            await svc.runs.end(name, caller.name)
    else:
        _require_in_policy(svc, scope, name)
        revocation = await svc.revocations.revoke(new_revocation(scope, name, caller.name, why))
        await record_event(svc, revocation, "revoke")
    return JSONResponse(_view(revocation), status_code=201)


async def lift(request: Request) -> Response:
    caller, svc = await _admin(request)
    try:
        scope = Scope(request.path_params.get("scope", "all"))
    except ValueError:
        raise BadRequest("scope must be runtime, upstream or all") from None
    name = request.path_params.get("name", "")
    _require_in_policy(svc, scope, name)
    revocation = await svc.revocations.lift(scope, name, caller.name)
    await record_event(svc, revocation, "lift")
    return JSONResponse(_view(revocation))


def _require_in_policy(svc: Services, scope: Scope, name: str) -> None:
    """A runtime or upstream revocation names one in policy (junk ones are the reaper's)."""
    if not in_policy(svc.policies)(scope, name):
        raise NotFound(f"no {scope.value} {name!r} in policy", Reason.UNKNOWN_REVOCATION_TARGET)


async def list_revocations(request: Request) -> Response:
    _, svc = await _admin(request)
    records = sorted((await svc.revocations.load()).values(), key=lambda r: r.when)
    return JSONResponse({"revocations": [_view(r) for r in records]})


async def run_audit(request: Request) -> Response:
    _, svc = await _admin(request)
    run_id = request.path_params["run_id"]
    record = await svc.runs.get(run_id)
    since = float(record.created - 5) if record else None
    try:
        limit = min(int(request.query_params.get("limit", "500")), 5000)
    except ValueError:
        raise BadRequest("limit must be a whole number", Reason.INVALID_REQUEST) from None
    entries = await auditlog.query(svc.redis, auditlog.Filter(run=run_id), since=since, limit=limit)
    return JSONResponse({"run_id": run_id, "entries": entries})


def _view(record: Revocation) -> dict[str, Any]:
    return {"scope": record.scope.value, "name": record.name, "who": record.who, "why": record.why,
            "when": record.when, "not_before": record.not_before, "blocked": record.blocked,
            "lifted_by": record.lifted_by, "lifted_at": record.lifted_at}


ROUTES = [
    Route("/v1/revocations", revoke, methods=["POST"]),
    Route("/v1/revocations", list_revocations, methods=["GET"]),
    Route("/v1/revocations/all", lift, methods=["DELETE"], name="lift_all"),
    Route("/v1/revocations/{scope}/{name}", lift, methods=["DELETE"]),
    Route("/v1/runs/{run_id}/audit", run_audit, methods=["GET"]),
]
