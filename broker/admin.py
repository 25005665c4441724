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

import logging
import re
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from broker.bodies import read_json_object
from broker.openapi import DEFAULT_AUDIT_LIMIT, MAX_AUDIT_LIMIT
from broker.services import Services, authenticate, services
from contract import audit_stream, revocation_events
from contract.errors import BadRequest, NotFound, Reason, Unavailable, ValetkeyError
from contract.revocations import Revocation, Scope, in_policy, new_revocation

if TYPE_CHECKING:
    from broker.callers import Caller
    from broker.runs import RunRecord

log = logging.getLogger("valetkey.broker")


async def _admin(request: Request) -> tuple[Caller, Services]:
    caller = await authenticate(request)
    caller.require_admin()
    return caller, services(request)


NOT_RECORDED = ("the revocation was NOT recorded and is not in force; retry until it is "
                "(`valetkey revoke` retries by itself)")


async def end_run_artifacts(svc: Services, record: RunRecord, who: str, why: str) -> Revocation:
    """Revoke the run's tokens everywhere and every Vault token or lease created for it."""
    revocation = await revocation_events.revoke_and_record(
        svc.redis, new_revocation(Scope.RUN, record.run_id, who, why, run_expires=record.expires),
        svc.settings.audit_maxlen, runtime=record.runtime)
    await svc.keeper.save(revocation)
    try:  # its requests waiting for a person end too (their gateways cut them on the revocation)
        await svc.approvals.cancel_run(record.run_id, who)
    except Unavailable as exc:
        log.warning('{"event":"approval_cancel_failed","run":"%s","reason":"%s"}', record.run_id, exc.code)
    for accessor in record.vault_accessors:
        try:
            await svc.vault.revoke_accessor(accessor)
        except ValetkeyError as exc:  # the run is revoked either way; say what was left behind
            log.warning('{"event":"vault_revoke_failed","run":"%s","reason":"%s"}', record.run_id, exc.code)
    return revocation


async def record_event(svc: Services, revocation: Revocation, action: str) -> None:
    await revocation_events.record_event(svc.redis, revocation, action, svc.settings.audit_maxlen)


def not_recorded(exc: Unavailable) -> Unavailable:
    """A dependency failed before the revocation was written: say so, in words and as a field."""
    return Unavailable(f"{exc.detail}: {NOT_RECORDED}", exc.reason, recorded=False)


_REVOKE_KEYS = frozenset({"scope", "name", "reason"})
_DEFAULT_WHY = "revoked by the security team"
_AUDIT_LIMIT = re.compile(r"[0-9]{1,4}", re.ASCII)


def revoke_request(body: dict[str, Any]) -> tuple[Scope, str, str]:
    """(scope, name, why) from a revocation body: the checks ``broker/openapi.py`` describes."""
    if set(body) - _REVOKE_KEYS:
        raise BadRequest(f"unknown members {sorted(set(body) - _REVOKE_KEYS)}; allowed: scope, name, reason")
    scope = next((s for s in Scope if s.value == body.get("scope")), None)
    if scope is None:
        raise BadRequest("scope must be run, runtime, upstream or all")
    name, why = body.get("name", ""), body.get("reason", _DEFAULT_WHY)
    if not isinstance(name, str) or not isinstance(why, str):
        raise BadRequest("name and reason must be strings")
    return scope, name, why or _DEFAULT_WHY


async def revoke(request: Request) -> Response:
    try:
        return await _revoke(request)
    except Unavailable as exc:
        raise not_recorded(exc) from None


async def _revoke(request: Request) -> Response:
    caller, svc = await _admin(request)
    scope, name, why = revoke_request(await read_json_object(request))
    revocation = await revoke_as(svc, caller, scope, name, why)
    return JSONResponse({**view(revocation), "recorded": True}, status_code=201)


async def revoke_as(svc: Services, caller: Caller, scope: Scope, name: str, why: str) -> Revocation:
    """Record a revocation by ``caller`` (an admin): the API's and the console's one way."""
    caller.require_admin()
    if scope is Scope.RUN:
        record = await svc.runs.get(name)
        if record is None:  # unknown here (expired, or Redis lost it): revoke the id all the same
            revocation = await revocation_events.revoke_and_record(
                svc.redis, new_revocation(scope, name, caller.name, why), svc.settings.audit_maxlen)
            await svc.keeper.save(revocation)
        else:
            revocation = await end_run_artifacts(svc, record, caller.name, why)
            try:
                await svc.runs.end(name, caller.name)
            except Unavailable as exc:  # recorded and in force; only the run record still says active
                log.warning('{"event":"run_end_failed","run":"%s","reason":"%s"}', name, exc.code)
    else:
        _require_in_policy(svc, scope, name)
        revocation = await revocation_events.revoke_and_record(
            svc.redis, new_revocation(scope, name, caller.name, why), svc.settings.audit_maxlen)
    await svc.keeper.save(revocation)  # the durable copy (broker/revocation_keeper.py)
    return revocation


async def lift(request: Request) -> Response:
    try:
        caller, svc = await _admin(request)
        raw_scope, name = request.path_params.get("scope", "all"), request.path_params.get("name", "")
        if raw_scope == Scope.RUN.value:
            raise BadRequest("a run revocation cannot be lifted; mint a new run")
        scope = {"runtime": Scope.RUNTIME, "upstream": Scope.UPSTREAM}.get(raw_scope)
        if scope is None and not (raw_scope == "all" and not name):  # only DELETE .../all lifts all
            raise BadRequest("scope must be runtime or upstream (DELETE /v1/revocations/all lifts all)")
        _require_in_policy(svc, scope or Scope.ALL, name)
        revocation = await svc.revocations.lift(scope or Scope.ALL, name, caller.name)
    except Unavailable as exc:
        raise Unavailable(f"{exc.detail}: the lift was NOT recorded; the revocation still stands",
                          exc.reason, recorded=False) from None
    await svc.keeper.save(revocation)
    await record_event(svc, revocation, "lift")
    return JSONResponse({**view(revocation), "recorded": True})


def _require_in_policy(svc: Services, scope: Scope, name: str) -> None:
    """A runtime or upstream revocation names one in policy (junk ones are the reaper's)."""
    if not in_policy(svc.policies)(scope, name):
        raise NotFound(f"no {scope.value} {name!r} in policy", Reason.UNKNOWN_REVOCATION_TARGET)


async def list_revocations(request: Request) -> Response:
    _, svc = await _admin(request)
    records = sorted((await svc.revocations.load()).values(), key=lambda r: r.when)
    return JSONResponse({"revocations": [view(r) for r in records]})


async def run_audit(request: Request) -> Response:
    _, svc = await _admin(request)
    raw_limit = request.query_params.get("limit", str(DEFAULT_AUDIT_LIMIT))
    if not _AUDIT_LIMIT.fullmatch(raw_limit) or not 1 <= int(raw_limit) <= MAX_AUDIT_LIMIT:
        raise BadRequest(f"limit must be a whole number from 1 to {MAX_AUDIT_LIMIT}")
    limit = int(raw_limit)
    run_id = request.path_params["run_id"]
    record = await svc.runs.get(run_id)
    since = float(record.created - 5) if record else None
    entries = await audit_stream.query(svc.redis, audit_stream.Filter(run=run_id), since=since, limit=limit)
    return JSONResponse({"run_id": run_id, "entries": entries})


def view(record: Revocation) -> dict[str, Any]:
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
