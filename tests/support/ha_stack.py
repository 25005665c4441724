"""Several brokers and gateway replicas over one Redis URL (a plain server or Sentinel), reusing the
gateway stack's Vault, policies and echo upstreams; and a traffic loop that records every answer.

The replicas run in-process under uvicorn (``ThreadedServer``), each with its own event loop and
Redis pool, as separate processes would. ``Traffic`` sends requests from a thread until stopped and
keeps (time, replica, run, status, reason) for each.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from broker.app import create_app
from broker.settings import BrokerSettings
from gateways.app import GatewayApp
from gateways.server import GatewayProtocol
from tests.support.gateway_stack import ISSUER, Stack, gateway_settings, loopback_resolver
from tests.support.servers import ThreadedServer

UPSTREAM = "echo"
PATH = "/v1/items/1"


@dataclass
class HAStack:
    base: Stack
    redis_url: str
    brokers: list[ThreadedServer] = field(default_factory=list)
    gateways: list[ThreadedServer] = field(default_factory=list)
    vault_addr: str = ""  # VAULT_ADDR for the replicas (several nodes of a cluster); default the stack's
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
