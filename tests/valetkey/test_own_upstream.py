"""The README's "Your own upstream in dev", step by step, from a fresh state directory.

The policy is the README's own file (only the port differs).

Own policy for a real local upstream that accepts only its real secret; `valetkey dev` says the
secret is a placeholder and how to write the real one; the real secret is written once; a run is
created with the runtime token dev printed; a call through the gateway reaches the upstream with
the real secret; the printed admin token revokes the run; the next call is refused; the audit
stream shows both calls and the revocation. The CLI finds the stack by itself: no VALETKEY_* or
VAULT_* variable is set except VAULT_TOKEN, and no --broker or --redis flag is given.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.support.devstack import output_until_ready
from valetkey.dev.services import free_port

pytestmark = pytest.mark.slow

VALETKEY = str(Path(sys.executable).parent / "valetkey")
REAL_SECRET = "inv-real-secret-0123456789"

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_policy(port: int) -> str:
    """The policy file of the README's walkthrough, pointed at this test's upstream port."""
    text = README.read_text()
    block = text[text.index("# mine/inventory.yaml\n"):]
    block = block[:block.index("```")]
    assert "http://127.0.0.1:9000" in block
    return block.replace("http://127.0.0.1:9000", f"http://127.0.0.1:{port}")


class Inventory(BaseHTTPRequestHandler):
    """Answers 200 only to the real secret, like a real API; 401 to anything else."""

    def do_GET(self) -> None:
        ok = self.headers.get("Authorization") == f"Bearer {REAL_SECRET}"
        body = json.dumps({"item": self.path.rsplit("/", 1)[-1]} if ok else {"error": "bad key"}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def inventory() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Inventory)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VALETKEY_", "VAULT_"))}
    return {**env, **extra}


def cli(cwd: Path, *args: str, token: str = "", stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = clean_env(VAULT_TOKEN=token) if token else clean_env()
    return subprocess.run([VALETKEY, *args], cwd=cwd, env=env, input=stdin, capture_output=True,
                          text=True, timeout=60, check=False)


def call(env: dict[str, str]) -> httpx.Response:
    return httpx.get(f"{env['INVENTORY_URL']}/items/42",
                     headers={"Authorization": f"Bearer {env['INVENTORY_TOKEN']}"}, timeout=10)


def test_own_upstream_walkthrough(tmp_path: Path, inventory: int) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "inventory.yaml").write_text(readme_policy(inventory))
    ports = [str(free_port()) for _ in range(3)]
    proc = subprocess.Popen(
        [VALETKEY, "dev", "--policy-dir", "policies", "--no-demo", "--vault-port", ports[0],
         "--redis-port", ports[1], "--broker-port", ports[2], "--gateway-port", "0"],
        cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    text = output_until_ready(proc, 90)
    try:
        assert "Ctrl-C to stop" in text, text
        assert "PLACEHOLDER secrets in Vault for: inventory" in text
        assert "valetkey secret put inventory" in text
        state = tmp_path / ".valetkey-dev"
        runtime_token = (state / "runtime-inventory-agent-token").read_text().strip()
        admin_token = (state / "admin-token").read_text().strip()
        assert str(state / "runtime-inventory-agent-token") in text
        assert str(state / "admin-token") in text

        wrote = cli(tmp_path, "secret", "put", "inventory", stdin=REAL_SECRET + "\n")
        assert wrote.returncode == 0, wrote.stderr
        assert REAL_SECRET not in wrote.stdout + wrote.stderr

        created = cli(tmp_path, "run", "create", "--grant", "inventory:read_items", "--format", "env",
                      token=runtime_token)
        assert created.returncode == 0, created.stderr
        sandbox = dict(line.split("=", 1) for line in created.stdout.splitlines() if "=" in line)
        run_id = sandbox["VALETKEY_RUN_ID"]

        deadline = time.monotonic() + 15  # the gateway re-reads the secret every 2s in dev
        answer = call(sandbox)
        while answer.status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.5)
            answer = call(sandbox)
        assert (answer.status_code, answer.json()) == (200, {"item": "42"})

        shown = cli(tmp_path, "run", "show", "--json", run_id, token=runtime_token)
        assert json.loads(shown.stdout)["state"] == "active", shown.stderr

        revoked = cli(tmp_path, "revoke", "--run", run_id, "--reason", "walkthrough", token=admin_token)
        assert revoked.returncode == 0, revoked.stderr
        assert f"revoked run {run_id}" in revoked.stdout
        assert "warning" not in revoked.stderr

        refused = call(sandbox)
        assert refused.status_code in (401, 403), refused.text
        assert refused.json()["error"] == "token_revoked"

        shown = cli(tmp_path, "run", "show", run_id, token=admin_token)
        assert shown.returncode == 0, shown.stderr
        assert "state    revoked" in shown.stdout
        assert "walkthrough" in shown.stdout

        audit = cli(tmp_path, "audit", "query", "--run", run_id, "--since", "15m", "--json")
        assert audit.returncode == 0, audit.stderr
        entries = [json.loads(line) for line in audit.stdout.splitlines()]
        requests = [(e.get("decision"), e.get("reason")) for e in entries if e["kind"] == "request"]
        assert ("allow", "ok") in requests or any(d == "allow" for d, _ in requests), entries
        assert ("deny", "token_revoked") in requests, entries
        assert any(e["kind"] == "revocation" and e.get("why") == "walkthrough" for e in entries), entries
        for output in (text, created.stdout, audit.stdout, shown.stdout):
            assert REAL_SECRET not in output
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
