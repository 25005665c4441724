"""`valetkey dev`: the README's first command brings the stack up, mints a demo run, stops cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.devstack import output_until_ready
from valetkey.dev.services import free_port

pytestmark = pytest.mark.slow

VALETKEY = str(Path(sys.executable).parent / "valetkey")


def _dev(tmp_path: Path, *ports: int, extra: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    vault, redis, broker = ports
    env = {**os.environ, "VALETKEY_DEV_DIR": str(tmp_path)}
    return subprocess.Popen(
        [VALETKEY, "dev", "--vault-port", str(vault), "--redis-port", str(redis),
         "--broker-port", str(broker), "--gateway-port", "0", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def test_dev_stack_up_demo_and_clean_stop(tmp_path: Path) -> None:
    ports = (free_port(), free_port(), free_port())
    proc = _dev(tmp_path, *ports)
    text = output_until_ready(proc, 60)
    try:
        assert "Ctrl-C to stop" in text, text
        assert "demo run run_" in text
        assert "OPENAI_API_KEY=" in text
        assert "Try it, in another shell:" in text
        assert "GITHUB_TOKEN=" in text
        proxy = next(line.split()[1] for line in text.splitlines() if line.strip().startswith("proxy "))
        assert httpx.get(f"{proxy}/.valetkey/readyz", timeout=5).json()["status"] == "ready"
        commands = [line.strip().split("   #")[0].strip() for line in text.splitlines()
                     if line.strip().startswith(("set -a", "curl "))]
        assert len(commands) == 4, text
        source, inject, echo, passthrough = commands
        outputs = [subprocess.run(["bash", "-c", f"{source}; {cmd}"], capture_output=True, text=True,
                                  timeout=30, check=False).stdout for cmd in (inject, echo, passthrough)]
        assert '"full_name": "acme/widgets"' in outputs[0]
        assert "[REDACTED:valetkey]" in outputs[1]
        assert '"error": "credential_passthrough"' in outputs[2]
        ready = httpx.get(f"http://127.0.0.1:{ports[2]}/readyz", timeout=5)
        assert ready.json()["checks"] == {"vault": True, "vault_token": True, "redis": True}
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "stopping" in out
    for port in ports:  # every child is gone: nothing listens any more
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_dev_refuses_a_taken_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        proc = _dev(tmp_path, free_port(), free_port(), taken, extra=("--no-demo",))
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert f"broker port {taken}" in out
