"""Several brokers and gateway replicas over one Redis URL (a plain server or Sentinel), reusing the
gateway stack's Vault, policies and echo upstreams; and a traffic loop that records every answer.

The replicas run in-process under uvicorn (``ThreadedServer``), each with its own event loop and
Redis pool, as separate processes would. ``Traffic`` sends requests from a thread until stopped and
keeps (time, replica, run, status, reason) for each.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from broker.app import create_app
from broker.settings import BrokerSettings
from contract import keys
from gateways.app import GatewayApp
from gateways.server import GatewayProtocol
from tests.support.gateway_stack import ISSUER, Stack, gateway_settings, loopback_resolver
from tests.support.servers import ThreadedServer

UPSTREAM = "echo"
PATH = "/v1/items/1"
# failover tests: 1 s (default 3 s), so a failover of ~2.5 s shows the refusals, not only memory
MAX_STALE = "1s"


@dataclass
class HAStack:
    base: Stack
    redis_url: str
    brokers: list[ThreadedServer] = field(default_factory=list)
    gateways: list[ThreadedServer] = field(default_factory=list)
    vault_addr: str = ""  # VAULT_ADDR for the replicas (several nodes of a cluster); default the stack's
    topology: Any = None  # the Redis topology under test (tests kill its nodes)
    _runtime_token: str = ""

    @property
    def runtime_token(self) -> str:
        """One token of the runtime ``tester`` (taken once: Vault may be failing over later)."""
        if not self._runtime_token:
            self._runtime_token = self.base.vault.runtime_token("tester")
        return self._runtime_token

    def start_broker(self) -> ThreadedServer:
        settings = BrokerSettings.from_env({
            "VAULT_ADDR": self.vault_addr or self.base.vault.addr, "VAULT_TOKEN": self.base.vault.broker_token,
            "VALETKEY_REDIS_URL": self.redis_url, "VALETKEY_POLICY_DIR": str(Path(".")),
            "VALETKEY_ISSUER": ISSUER,
        })
        server = ThreadedServer(create_app(settings, self.base.policies)).start()
        self.brokers.append(server)
        return server

    def start_gateway(self, **extra: str) -> ThreadedServer:
        stack = Stack(self.base.vault, self.base.policies, self.brokers[0].url, self.redis_url,
                      self.base.upstreams, self.base.ca_file)
        if self.vault_addr:
            extra = {"VAULT_ADDR": self.vault_addr, **extra}
        app = GatewayApp(gateway_settings(stack, UPSTREAM, **extra), self.base.policies.upstreams[UPSTREAM],
                         resolver=loopback_resolver)
        server = ThreadedServer(app, http=GatewayProtocol).start()
        self.gateways.append(server)
        return server

    def close(self) -> None:
        for server in [*self.gateways, *self.brokers]:
            server.stop()

    def mint(self, purposes: list[str], broker: int = 0, ttl: str = "10m") -> tuple[str, str]:
        """(run id, echo token) minted by the runtime ``tester``."""
        response = self.post_mint(purposes, broker, ttl)
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        token = next(v for k, v in body["env"].items() if k == "ECHO_TOKEN")
        return body["run_id"], token

    def post_mint(self, purposes: list[str], broker: int = 0, ttl: str = "10m",
                  upstream: str = UPSTREAM) -> httpx.Response:
        grants = [{"upstream": upstream, "purpose": p} for p in purposes]
        return httpx.post(f"{self.brokers[broker].url}/v1/runs", json={"grants": grants, "ttl": ttl},
                          headers={"X-Vault-Token": self.runtime_token}, timeout=10)

    def revoke(self, scope: str, name: str, broker: int = 0) -> httpx.Response:
        return httpx.post(f"{self.brokers[broker].url}/v1/revocations",
                          json={"scope": scope, "name": name, "reason": "ha test"},
                          headers={"X-Vault-Token": self.base.vault.admin_token}, timeout=10)

    def lift(self, scope: str, name: str) -> httpx.Response:
        return httpx.delete(f"{self.brokers[0].url}/v1/revocations/{scope}/{name}",
                            headers={"X-Vault-Token": self.base.vault.admin_token}, timeout=10)


@contextmanager
def two_of_each(base: Stack, topology: Any) -> Iterator[HAStack]:
    """Two brokers and two gateways (at ``MAX_STALE``) over ``topology.url`` (a started Sentinel
    set or Redis Cluster, kept as ``stack.topology``); all stopped on leaving."""
    stack = HAStack(base, topology.url)
    stack.topology = topology
    try:
        stack.start_broker()
        stack.start_broker()
        stack.start_gateway(VALETKEY_REVOCATION_MAX_STALE=MAX_STALE)
        stack.start_gateway(VALETKEY_REVOCATION_MAX_STALE=MAX_STALE)
        yield stack
    finally:
        stack.close()


def call(gateway: ThreadedServer, token: str, path: str = PATH) -> tuple[int, str]:
    try:
        response = httpx.get(f"{gateway.url}{path}", headers={"Authorization": f"Bearer {token}"},
                             timeout=5.0)
    except httpx.HTTPError as exc:
        return 0, type(exc).__name__
    reason = ""
    if response.status_code != 200:
        try:
            reason = str(response.json().get("error", ""))
        except ValueError:
            reason = response.text[:40]
    return response.status_code, reason


@dataclass
class Answer:
    at: float
    gateway: int
    run: str
    status: int
    reason: str


class Traffic:
    """Requests for each (run, token) through every gateway, round-robin, from one thread."""

    def __init__(self, stack: HAStack, runs: dict[str, str], pause: float = 0.02) -> None:
        self._stack = stack
        self._runs = runs
        self._pause = pause
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for index, gateway in enumerate(list(self._stack.gateways)):
                for run, token in self._runs.items():
                    status, reason = call(gateway, token)
                    self.answers.append(Answer(time.monotonic(), index, run, status, reason))
            time.sleep(self._pause)

    def of(self, run: str, since: float = 0.0) -> list[Answer]:
        return [a for a in list(self.answers) if a.run == run and a.at >= since]

    def wait_for(self, run: str, status: int, since: float, timeout: float = 30.0) -> float:
        """When the first answer with ``status`` for ``run`` after ``since`` came (monotonic)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for answer in self.of(run, since):
                if answer.status == status:
                    return answer.at
            time.sleep(0.05)
        raise AssertionError(f"no {status} for {run} within {timeout}s; last: {self.of(run, since)[-5:]}")


# while the Redis that holds the revocations is gone: served from memory for at most
# VALETKEY_REVOCATION_MAX_STALE, then refused; budgeted and Redis-bound work refused at once
DURING_FAILOVER = {(200, ""), (503, "revocation_state_stale"), (503, "redis_unavailable")}


@dataclass
class Failover:
    traffic: Traffic
    old: Any
    new: Any
    killed_at: float
    promoted_at: float
    resumed_at: float
    during: list[Answer]  # the live run's answers from the kill to the first 200 after the promotion
    refused: list[Answer]

    def summary(self) -> str:
        return (f"{self.old} -> {self.new}; promoted {self.promoted_at - self.killed_at:.1f}s after the "
                f"kill, traffic resumed {self.resumed_at - self.killed_at:.1f}s after; {len(self.refused)} of "
                f"{len(self.during)} requests refused meanwhile ({sorted({a.reason for a in self.refused})})")


def fail_over(stack: HAStack, live: str, dead: str, kill: Callable[[], Any],
              promoted: Callable[[Any], Any]) -> Failover:
    """Traffic for the runs ``live`` and ``dead`` (revoked) while ``kill()`` kills what holds the
    revocations and ``promoted(old)`` waits for its replacement; checked with ``check_failover``."""
    with Traffic(stack, {"live": live, "dead": dead}) as traffic:
        time.sleep(0.5)
        killed_at = time.monotonic()
        old = kill()
        new = promoted(old)
        promoted_at = time.monotonic()
        resumed_at = traffic.wait_for("live", 200, promoted_at)
        time.sleep(0.5)
    during = [a for a in traffic.of("live", killed_at) if a.at <= resumed_at]
    refused = check_failover(traffic, killed_at, during, promoted_at)
    return Failover(traffic, old, new, killed_at, promoted_at, resumed_at, during, refused)


def check_failover(traffic: Traffic, killed_at: float, during: list[Answer], promoted_at: float) -> list[Answer]:
    """What a failover under traffic must look like (Sentinel or Cluster); returns the refusals of
    the live run ``during`` it: only the codes of ``DURING_FAILOVER``; the revoked run ``dead``
    never allowed; at least one refusal; and after a replica's first refusal, no 200 before the
    promotion (nothing allowed on stale state)."""
    assert {(a.status, a.reason) for a in traffic.of("live", killed_at)} <= DURING_FAILOVER
    assert {(a.status, a.reason) for a in traffic.of("dead")} <= {
        (401, "token_revoked"), (503, "revocation_state_stale")}
    refused = [a for a in during if a.status != 200]
    assert refused, "no request was refused while the revocations had no primary"
    for index in {a.gateway for a in during}:
        mine = [a for a in during if a.gateway == index]
        first = next((a.at for a in mine if a.status == 503), None)
        assert first is None or all(a.at >= promoted_at - 1.0 for a in mine
                                    if a.status == 200 and a.at > first)
    return refused


def audit_lines(client: redis.Redis) -> int:
    """Request lines in the audit stream (the stream is one key: one node of the cluster)."""
    return sum(1 for _, f in client.xrange(keys.AUDIT_STREAM)
               if f.get(b"kind") == b"request" and "decision" in json.loads(f[b"line"]))


def wait_audit(client: redis.Redis, sent: int, timeout: float = 15.0) -> int:
    deadline = time.monotonic() + timeout
    while (found := audit_lines(client)) < sent and time.monotonic() < deadline:
        time.sleep(0.2)
    return found
