"""Child processes of ``valetkey dev``: port checks, start with a readiness probe, stop cleanly."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from contract.errors import ServiceError
from valetkey.dev.services import LOOPBACK

READY_TIMEOUT = 60.0  # a bound, not a target: a loaded laptop starting four gateways at once


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def check_ports(ports: dict[str, int]) -> None:
    taken = [f"{name} port {port}" for name, port in ports.items() if port and not port_free(port)]
    if taken:
        raise ServiceError(f"already in use: {', '.join(taken)}; pick others with the --*-port options")


@dataclass
class Child:
    """A valetkey child process (broker, gateway, demo upstream) with a readiness URL."""

    name: str
    argv: list[str]
    env: dict[str, str]
    ready_url: str
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.spawn()
        self.wait_ready()

    def spawn(self) -> None:
        """Start the process without waiting: several children can then get ready side by side."""
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(  # noqa: S603 - fixed argv
                self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def wait_ready(self) -> None:
        if self.proc is None:
            raise ServiceError(f"{self.name} was never started")
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServiceError(f"{self.name} exited with {self.proc.returncode}: {self.tail()}")
            if self.ready_url.startswith("tcp://"):  # a Postgres gateway: listening is ready
                if not port_free(int(self.ready_url.rsplit(":", 1)[1])):
                    return
            else:
                try:
                    if httpx.get(self.ready_url, timeout=1.0).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
            time.sleep(0.05)
        raise ServiceError(f"{self.name} not ready within {READY_TIMEOUT:.0f}s: {self.tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-1500:]
        except OSError:
            return ""


def valetkey_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "valetkey.cli", *args]
