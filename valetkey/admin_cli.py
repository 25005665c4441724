"""CLI for the security team: ``valetkey revoke``, ``valetkey revocations``, ``valetkey audit``.

``revoke`` and ``revocations`` go through the broker API with the caller's Vault token (it must
carry the admin policy); ``revoke --break-glass`` writes to Redis directly when Vault (and so the
broker's caller lookup) is down. ``audit`` reads the Redis audit stream directly
(VALETKEY_REDIS_URL).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click
import httpx
import redis.asyncio as aioredis

from broker.runs import RunRegistry
from contract import audit_stream
from contract.errors import Unavailable, ValetkeyError
from contract.revocation_events import record_event, revoke_and_record
from contract.revocations import Revocation, RevocationStore, Scope, new_revocation
from policies.units import parse_duration
from valetkey.cli_support import (
    BROKER_OPTION,
    CONTEXT,
    JSON_OPTION,
    broker_client,
    broker_url,
    fail,
    options,
    show,
)

REDIS_OPTION = click.option(
    "--redis", "redis_url", envvar="VALETKEY_REDIS_URL", default=None, metavar="URL",
    help="Redis holding the audit stream [env: VALETKEY_REDIS_URL; default: a running "
         "`valetkey dev` stack's].",
)

T = TypeVar("T")


RETRY_FIRST, RETRY_MAX = 1.0, 10.0  # seconds between attempts to record a revocation


class NotRecorded(Exception):
    """This attempt did not record the revocation; another may."""


def until_recorded(attempt: Callable[[], T], what: str, wait: bool = True) -> T:
    """Call ``attempt`` until it records ``what``, saying so on stderr; Ctrl-C gives up, loudly.
    Without ``wait``, the first failure ends the command (one line, exit 1)."""
    delay = RETRY_FIRST
    try:
        while True:
            try:
                return attempt()
            except NotRecorded as exc:
                if not wait:
                    fail(f"{exc}; the {what} was NOT recorded")
                click.echo(f"{what}: NOT recorded yet ({exc}); retrying in {delay:g}s "
                           "(Ctrl-C to give up)", err=True)
            time.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)
    except KeyboardInterrupt:
        fail(f"interrupted: {what} was NOT recorded")
        raise  # fail() exits; this line is for the type checker


def _recorded(response: httpx.Response) -> dict[str, Any]:
    if response.status_code == 503:
        try:
            body = response.json()
        except ValueError:
            body = {"error": "unavailable", "detail": response.text[:200]}
        hint = " (Vault down? --break-glass writes to Redis directly)" \
            if body.get("error") == "vault_unavailable" else ""
        raise NotRecorded(f"503 {body.get('error')}: {body.get('detail')}{hint}")
    return show(response)


def _via_broker(client: httpx.Client, source: str, method: str, path: str,
                body: dict[str, Any] | None = None) -> Callable[[], dict[str, Any]]:
    def attempt() -> dict[str, Any]:
        try:
            return _recorded(client.request(method, path, json=body))
        except httpx.TransportError as exc:
            raise NotRecorded(f"cannot reach the broker at {str(client.base_url).rstrip('/')} ({source}): "
                              f"{type(exc).__name__}; start it, or give its address with --broker URL "
                              "or VALETKEY_BROKER_URL") from None

    return attempt


@click.command("revoke")
@BROKER_OPTION
@click.option("--run", "run_id", help="one run: its tokens stop everywhere; its Vault tokens are revoked")
@click.option("--runtime", help="every run this runtime started, and its new mints")
@click.option("--upstream", help="kill switch for one upstream's audience, or one destination")
@click.option("--all", "everything", is_flag=True, help="every token and every mint")
@click.option("--reason", default="", help="why (recorded with who and when)")
@click.option("--lift", is_flag=True, help="lift a runtime, upstream or global revocation")
@click.option("--no-wait", "no_wait", is_flag=True,
              help="fail at once (exit 1) instead of retrying until the broker has recorded it")
@click.option("--break-glass", "break_glass", is_flag=True,
              help="write to Redis directly, without the broker or Vault (see docs/operations.md)")
@click.option("--redis", "redis_url", envvar="VALETKEY_REDIS_URL", default="",
              help="with --break-glass: the Redis that holds the revocations [$VALETKEY_REDIS_URL]")
@JSON_OPTION
def revoke_command(broker: str, run_id: str | None, runtime: str | None, upstream: str | None,
                   everything: bool, reason: str, lift: bool, no_wait: bool, break_glass: bool,
                   redis_url: str, as_json: bool) -> None:
    """Revoke a run, a runtime, an upstream or everything (or --lift one).

    Retries until the broker has recorded it (a 503 or an unreachable broker records nothing),
    saying so on stderr; Ctrl-C gives up (exit 1), as does --no-wait at the first failure."""
    chosen = [(s, n) for s, n in (("run", run_id), ("runtime", runtime), ("upstream", upstream),
                                  ("all", "" if everything else None)) if n is not None]
    if len(chosen) != 1:
        fail("give exactly one of --run, --runtime, --upstream, --all")
    scope, name = chosen[0]
    what = f"{'lift of' if lift else 'revocation of'} {scope} {name}".rstrip()
    why = reason or "revoked from the command line"
    record: dict[str, Any]
    unknown_run = False
    if break_glass:
        if not redis_url:
            fail("--break-glass needs --redis URL (or VALETKEY_REDIS_URL)")
        revocation = until_recorded(lambda: _break_glass(redis_url, Scope(scope), name, why, lift), what,
                                    wait=not no_wait)
        record = {"scope": revocation.scope.value, "name": revocation.name, "when": revocation.when,
                  "who": revocation.who, "why": revocation.why, "lifted_by": revocation.lifted_by,
                  "recorded": True, "break_glass": True}
    else:
        source = broker_url(broker)[1]
        with broker_client(broker) as client:
            if lift:
                path = "/v1/revocations/all" if scope == "all" else f"/v1/revocations/{scope}/{name}"
                record = until_recorded(_via_broker(client, source, "DELETE", path), what, wait=not no_wait)
            else:
                body = {"scope": scope, "name": name, "reason": why}
                record = until_recorded(_via_broker(client, source, "POST", "/v1/revocations", body), what,
                                        wait=not no_wait)
                unknown_run = scope == "run" and client.get(f"/v1/runs/{name}").status_code == 404
    if as_json:
        click.echo(json.dumps({**record, "unknown_run": unknown_run}, indent=2))
    elif lift:
        click.echo(f"lifted {scope} {name}".rstrip() + f" (by {record['lifted_by']})")
        return
    else:
        click.echo(f"revoked {scope} {name}".rstrip() + f" at {_when(record['when'])} by {record['who']}: "
                   f"{record['why']}")
    if unknown_run:
        click.echo(f"warning: the broker has no run {name!r} (never created, mistyped, or expired and "
                   "purged); the revocation is recorded anyway, so any token for that ID is refused",
                   err=True)


def _break_glass(url: str, scope: Scope, name: str, why: str, lift: bool) -> Revocation:
    """The broker's own record and publish (``RevocationStore``), written from here: for when the
    broker cannot authenticate anyone because Vault is down. Audited with the OS user."""
    user = getpass.getuser()
    who = f"break-glass:{user}"
    marks = {"break_glass": True, "os_user": user}

    async def write() -> Revocation:
        client = aioredis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
        store = RevocationStore(client)
        try:
            if lift:
                revocation = await store.lift(scope, name, who)
            else:
                runs = RunRegistry(client)
                run = await runs.get(name) if scope is Scope.RUN else None
                revocation = await revoke_and_record(client, new_revocation(
                    scope, name, who, why, run_expires=run.expires if run else None),
                    audit_stream.DEFAULT_MAXLEN, **marks)
                if run is not None:
                    await runs.end(name, who)
                return revocation
            await record_event(client, revocation, "lift", audit_stream.DEFAULT_MAXLEN, **marks)
            return revocation
        except Unavailable as exc:
            raise NotRecorded(f"{exc.code}: {exc.detail}") from None
        finally:
            await client.aclose()

    try:
        return asyncio.run(write())
    except ValetkeyError as exc:
        fail(f"{exc.status} {exc.code}: {exc.detail}")
        raise


@click.command("revocations")
@BROKER_OPTION
@JSON_OPTION
def revocations_command(broker: str | None, as_json: bool) -> None:
    """List recorded revocations (standing and lifted)."""
    with broker_client(broker) as client:
        records = show(client.get("/v1/revocations"))["revocations"]
    if as_json:
        click.echo(json.dumps(records, indent=2))
        return
    if not records:
        click.echo("no revocations recorded", err=True)
    for r in records:
        state = "standing" if r["blocked"] else f"lifted by {r['lifted_by']} at {_when(r['lifted_at'])}"
        if r["scope"] == "run":
            state = "revoked"
        click.echo(f"{_when(r['when'])} {r['scope']:<8} {r['name'] or '*':<28} {state}; by {r['who']}: "
                   f"{r['why']}")


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _redis_url(explicit: str | None) -> str:
    """``--redis`` or ``VALETKEY_REDIS_URL``, else a running ``valetkey dev`` stack's Redis."""
    from valetkey.dev.state import find_running

    if explicit:
        return explicit
    dev = find_running()
    if dev is None:
        fail("no Redis given: set --redis URL or VALETKEY_REDIS_URL to the Redis that holds the audit "
             "stream (or start `valetkey dev`)")
    return dev.redis_url


def _redis(url: str) -> aioredis.Redis:
    return aioredis.Redis.from_url(url, socket_timeout=5.0)


filters = options(
    REDIS_OPTION,
    click.option("--run", "run_id", default="", help="One run."),
    click.option("--runtime", default="", help="One runtime."),
    click.option("--upstream", default="", help="One upstream."),
    click.option("--decision", type=click.Choice(["allow", "deny", "error"]), default=None,
                 help="allow; deny (refused, status < 500); error (the gateway could not complete "
                      "it, status >= 500: upstream unreachable or timed out, Vault or Redis down). An "
                      "upstream's own 4xx/5xx answer is allow [default: all]."),
    click.option("--reason", default="", help="A reason code, e.g. purpose_not_granted."),
    click.option("--kind", type=click.Choice(["request", "run", "revocation", "alert"]), default=None,
                 help="Entry kind [default: all]."),
    click.option("--json", "as_json", is_flag=True, help="Raw JSON lines."),
)


@click.group("audit", context_settings=CONTEXT)
def audit_group() -> None:
    """Read the audit stream (requests, revocations, alerts)."""


def _print(entry: dict[str, Any], as_json: bool) -> None:
    click.echo(json.dumps({"kind": entry["kind"], **entry["line"]}, sort_keys=True) if as_json
               else audit_stream.render(entry))


@audit_group.command("tail")
@filters
@click.option("-n", "--lines", default=20, show_default=True, help="How many recent entries.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new entries.")
def audit_tail(redis_url: str | None, run_id: str, runtime: str, upstream: str, decision: str | None,
               reason: str, kind: str | None, as_json: bool, lines: int, follow: bool) -> None:
    """The most recent entries, oldest first; --follow streams new ones."""
    flt = audit_stream.Filter(run_id, runtime, upstream, decision or "", reason, kind or "")
    url = _redis_url(redis_url)

    async def run() -> None:
        client = _redis(url)
        try:
            recent = await audit_stream.query(client, flt, limit=lines)
            for entry in reversed(recent):
                _print(entry, as_json)
            if follow:
                start = recent[0]["id"] if recent else "$"
                async for entry in audit_stream.follow(client, flt, start=start):
                    _print(entry, as_json)
        finally:
            await client.aclose()

    _run(run, url)


@audit_group.command("query")
@filters
@click.option("--since", default="1h", show_default=True, help="How far back, e.g. 15m, 2h, 1d.")
@click.option("--limit", default=1000, show_default=True, help="At most this many entries.")
def audit_query(redis_url: str | None, run_id: str, runtime: str, upstream: str, decision: str | None,
                reason: str, kind: str | None, as_json: bool, since: str, limit: int) -> None:
    """Entries matching every filter given, oldest first, within --since."""
    flt = audit_stream.Filter(run_id, runtime, upstream, decision or "", reason, kind or "")
    url = _redis_url(redis_url)
    try:
        window = parse_duration(since)
    except ValueError as exc:
        fail(f"--since: {exc}")
        return

    async def run() -> None:
        client = _redis(url)
        try:
            found = await audit_stream.query(client, flt, since=time.time() - window, limit=limit)
        finally:
            await client.aclose()
        for entry in reversed(found):
            _print(entry, as_json)
        if not as_json:
            click.echo(f"{len(found)} entr{'y' if len(found) == 1 else 'ies'}", err=True)

    _run(run, url)


def _run(func: Any, url: str) -> None:
    try:
        asyncio.run(func())
    except ValetkeyError as exc:
        fail(f"cannot read the audit stream at {url}: {exc.detail}; give the right Redis with --redis URL "
             "or VALETKEY_REDIS_URL")
    except KeyboardInterrupt:
        pass


COMMANDS = [revoke_command, revocations_command, audit_group]
