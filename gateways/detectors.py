"""Alerts with teeth: detectors over each run's recent decisions, shared by every replica.

Detectors run in the audit task, never on the request path. Counts live in Redis (one sorted
set per run and detector, trimmed to the window by a Lua script using Redis time), so a burst
spread across replicas is still one burst. Each alert fires once per run and kind (SET NX), and:

* is appended to the ``valetkey:alerts`` stream and the audit stream, and logged;
* is POSTed to the webhook from policy, signed ``X-Valetkey-Signature: t=<unix>,v1=<hex>`` with
  HMAC-SHA256 over ``"<t>.<body>"``, retried with backoff from a background queue;
* revokes the run when policy lists its kind under ``auto_revoke``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx
import redis.asyncio as aioredis

from contract import audit_stream, keys
from contract.env import SettingsError
from contract.errors import Decision
from contract.revocation_events import revoke_and_record
from contract.revocations import Scope, new_revocation
from contract.secret import Secret
from contract.tasks import stop_task
from gateways.audit import AuditRecord
from policies.model import Alerting, AlertKind

log = logging.getLogger("valetkey.alerts")
STREAM = keys.ALERTS_STREAM
PREFIX = keys.DETECT_PREFIX
FIRED_TTL = 24 * 3600
RETRIES = (0.2, 0.5, 1.0, 2.0, 5.0)
# refusals that say nothing about the agent's intent: a run retrying into its own rate limit has its
# own alert (budget_exhausted); too many requests in flight is load, not intent; stale state (keys,
# revocations) is ours; a revoked run is already stopped; a client that hangs up mid-upload (a
# cancelled call, a load generator stopping) refused nothing
NOT_A_DENIAL_SIGNAL = frozenset({"budget_exceeded", "run_concurrency_exceeded", "revocation_state_stale",
                                 "token_revoked", "client_disconnected", "jwks_stale", "jwks_unavailable",
                                 "approval_timeout", "approval_queue_full"})
PROBE_REASONS = frozenset({"purpose_not_granted", "audience_mismatch", "method_refused", "invalid_token",
                           "absolute_form_target", "token_revoked",
                           # the egress proxy: knocking on hosts, ports and names outside the allowlist
                           "destination_not_allowed", "destination_port_not_allowed",
                           "destination_ip_literal", "sni_missing", "sni_mismatch", "host_mismatch",
                           "run_mismatch",
                           # the enterprise deny list: a host or request no person may allow
                           "enterprise_denied"})

# KEYS[1] window set; ARGV: member, window_ms → number of members inside the window
_WINDOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('ZCARD', KEYS[1])
"""


@dataclass(frozen=True)
class Alert:
    kind: AlertKind
    run: str
    runtime: str
    upstream: str
    count: int
    threshold: int
    window: int
    request_id: str
    time: float
    auto_revoke: bool

    def to_json(self) -> dict[str, Any]:
        return {"event": "alert", "alert": self.kind.value, "run": self.run, "runtime": self.runtime,
                "upstream": self.upstream, "count": self.count, "threshold": self.threshold,
                "window": self.window, "request_id": self.request_id, "time": self.time,
                "auto_revoke": self.auto_revoke}


def sign(secret: Secret, body: bytes, timestamp: int) -> str:
    mac = hmac.new(secret.reveal().encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify_signature(secret: Secret, body: bytes, header: str, tolerance: int = 300) -> bool:
    """For receivers (and tests): constant-time check of the signature and its freshness."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    expected = sign(secret, body, timestamp).split("v1=", 1)[1]
    return abs(time.time() - timestamp) <= tolerance and hmac.compare_digest(expected, parts.get("v1", ""))


class WebhookSender:
    """A background queue of signed POSTs; failures retry with backoff and are then logged."""

    def __init__(self, url: str, secret: Secret | None, http: httpx.AsyncClient) -> None:
        if url and secret is None:
            raise SettingsError("an alert webhook is configured but VALETKEY_ALERT_WEBHOOK_SECRET is not "
                                "set: alerts would be unsigned and spoofable")
        self.url = url
        self._secret = secret
        self._http = http
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(1000)
        self._task: asyncio.Task[None] | None = None
        self.delivered = 0

    def send(self, event: dict[str, Any]) -> None:
        if self.url:
            with contextlib.suppress(asyncio.QueueFull):
                self._queue.put_nowait(event)

    async def start(self) -> None:
        if self.url:
            self._task = asyncio.create_task(self._run(), name="alert-webhook")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None
        await self._http.aclose()

    async def _run(self) -> None:
        while True:
            event = await self._queue.get()
            body = json.dumps(event, sort_keys=True).encode()
            for attempt, pause in enumerate((0.0, *RETRIES)):
                await asyncio.sleep(pause)
                kind = str(event.get("event", "alert"))  # alert, approval_requested
                headers = {"content-type": "application/json", "x-valetkey-event": kind}
                if self._secret is not None:
                    headers["x-valetkey-signature"] = sign(self._secret, body, int(time.time()))
                try:
                    response = await self._http.post(self.url, content=body, headers=headers)
                    if response.status_code < 300:
                        self.delivered += 1
                        break
                except httpx.HTTPError:
                    pass
                if attempt == len(RETRIES):
                    log.warning('{"event":"alert_webhook_failed","alert":"%s","run":"%s"}',
                                event.get("alert"), event.get("run"))


class Detectors:
    def __init__(self, client: aioredis.Redis, policy: Alerting, webhook: WebhookSender,
                 audit_maxlen: int = audit_stream.DEFAULT_MAXLEN) -> None:
        self._maxlen = audit_maxlen
        self._redis = client
        self._policy = policy
        self._webhook = webhook
        self._window: Any = client.register_script(_WINDOW)
        self.fired: list[Alert] = []
        self._claimed: dict[str, Alert] = {}  # fired here, not yet fully announced

    def _candidates(self, record: AuditRecord) -> list[tuple[AlertKind, str]]:
        """(detector, member to count) for this decision."""
        found: list[tuple[AlertKind, str]] = []
        if record.decision is Decision.DENY and record.reason not in NOT_A_DENIAL_SIGNAL:
            found.append((AlertKind.DENIAL_BURST, record.request_id))
            if record.reason in PROBE_REASONS:
                found.append((AlertKind.PROBING, f"{record.method} {record.path}"))
        if record.reason == "credential_passthrough":
            found.append((AlertKind.CREDENTIAL_PASSTHROUGH, record.request_id))
        if record.reason == "budget_exceeded":
            found.append((AlertKind.BUDGET_EXHAUSTED, record.request_id))
        if record.redactions:
            found.append((AlertKind.SECRET_ECHOED, record.request_id))
        return found

    async def observe(self, record: AuditRecord, run_expires: int) -> None:
        if not record.run:
            return  # no verified run: nothing to attribute (still in the audit line and metrics)
        for kind, member in self._candidates(record):
            threshold = self._policy.thresholds[kind]
            key = f"{PREFIX}{record.run}:{kind.value}"
            count = int(await self._window(keys=[key], args=[member, threshold.window * 1000]))
            if count >= threshold.count:
                await self._fire(kind, record, count, run_expires)

    async def _fire(self, kind: AlertKind, record: AuditRecord, count: int, run_expires: int) -> None:
        flag = f"{PREFIX}{record.run}:fired:{kind.value}"
        alert = self._claimed.get(flag)
        if alert is None:
            if not await self._redis.set(flag, "1", nx=True, ex=FIRED_TTL):
                return  # fired already, here or at another replica
            threshold = self._policy.thresholds[kind]
            alert = Alert(kind, record.run, record.runtime, record.upstream, count, threshold.count,
                          threshold.window, record.request_id, time.time(),
                          kind in self._policy.auto_revoke)
            # claimed: if Redis fails below, the audit sink observes this line again and the
            # alert is finished then (the flag alone would make the retry skip it for good)
            self._claimed[flag] = alert
        await self._announce(alert, record, run_expires)
        del self._claimed[flag]
        self.fired.append(alert)
        self._webhook.send(alert.to_json())

    async def _announce(self, alert: Alert, record: AuditRecord, run_expires: int) -> None:
        kind = alert.kind
        event = alert.to_json()
        log.warning(json.dumps(event, sort_keys=True))
        await self._redis.xadd(STREAM, {"line": json.dumps(event, sort_keys=True)}, maxlen=10_000,
                               approximate=True)
        await audit_stream.append(self._redis, event, kind="alert", maxlen=self._maxlen)
        if alert.auto_revoke:
            revocation = new_revocation(Scope.RUN, record.run, f"valetkey-gateway:{record.upstream}",
                                        f"automatic: {kind.value} alert", run_expires=run_expires)
            await revoke_and_record(self._redis, revocation, self._maxlen, runtime=record.runtime)
