"""``valetkey proxy``: the egress proxy (``serve``) and its deployment CA (``ca show``, ``ca rotate``).

CA commands use VAULT_ADDR (else a running ``valetkey dev`` stack's Vault) and VAULT_TOKEN: the
security team's token (policy valetkey-admin) or an operator's.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from cryptography.hazmat.primitives import hashes

from contract.ca import KV_MOUNT, load_certs
from contract.env import SettingsError
from contract.errors import ValetkeyError
from policies.load import PolicyLoadError, load_policy_dir
from valetkey.bootstrap import open_client, vault_errors
from valetkey.broker_cli import vault_addr
from valetkey.cli_support import CONTEXT, JSON_OPTION, fail
from valetkey.proxy_bootstrap import read_public, rotate_ca

MOUNT_OPTION = click.option("--mount", default=KV_MOUNT, show_default=True,
                            help="KV v2 mount holding valetkey/proxy/ca and ca-public.")


@click.group("proxy", context_settings=CONTEXT)
def proxy_group() -> None:
    """The egress proxy (HTTPS_PROXY for sandboxes) and its deployment CA."""


@proxy_group.group("ca", context_settings=CONTEXT)
def ca_group() -> None:
    """The deployment CA the proxy signs terminated connections with."""


@contextmanager
def _vault(action: str) -> Iterator[Any]:
    addr, token = vault_addr(), os.environ.get("VAULT_TOKEN", "")
    if not addr or not token:
        fail("set VAULT_ADDR and VAULT_TOKEN (the security team's token, policy valetkey-admin)")
    try:
        with open_client(addr, token) as client, vault_errors(addr, action):
            yield client
    except ValetkeyError as exc:
        fail(exc.detail)


def _describe(pem: str) -> list[dict[str, str]]:
    return [{"role": "current" if i == 0 else "previous", "subject": c.subject.rfc4514_string(),
             "not_after": c.not_valid_after_utc.isoformat(),
             "sha256": c.fingerprint(hashes.SHA256()).hex()}
            for i, c in enumerate(load_certs(pem))]


@ca_group.command("show")
@MOUNT_OPTION
@JSON_OPTION
@click.option("--pem", "as_pem", is_flag=True, help="Print the PEM bundle (current, then previous).")
def ca_show(mount: str, as_json: bool, as_pem: bool) -> None:
    """The public CA certificates sandboxes trust: the current one, and the previous one during a
    rotation. Never the key."""
    with _vault("read the proxy CA's public certificates") as client:
        pem = read_public(client, mount)
    if as_pem:
        click.echo(pem, nl=False)
    elif as_json:
        click.echo(json.dumps({"certs": _describe(pem)}, indent=2))
    else:
        for cert in _describe(pem):
            click.echo(f"{cert['role']:<9} {cert['subject']}  until {cert['not_after']}  "
                       f"sha256 {cert['sha256'][:16]}…")


@ca_group.command("rotate")
@MOUNT_OPTION
@click.option("--overlap", default="", metavar="DURATION",
              help="How long until proxies sign with the new CA [default: the longest runtime max_ttl "
                   "in VALETKEY_POLICY_DIR (or the shipped policies), plus 5m].")
def ca_rotate(mount: str, overlap: str) -> None:
    """Stage a new CA: every run bundle minted from now on trusts it (beside the current one), and
    proxies sign with it once the overlap has passed, when every run minted before it has ended.
    Staging again before then replaces the staged CA, never the signing one."""
    import datetime

    from policies.load import SHIPPED_POLICY_DIR
    from policies.units import parse_duration

    try:
        if overlap:
            seconds = parse_duration(overlap)
        else:
            policies = load_policy_dir(Path(os.environ.get("VALETKEY_POLICY_DIR") or SHIPPED_POLICY_DIR))
            seconds = max((r.max_ttl for r in policies.runtimes.values()), default=0) + 300
    except (ValueError, PolicyLoadError) as exc:
        fail(f"--overlap: {exc}")
    with _vault("rotate the proxy CA") as client:
        rotation = rotate_ca(client, mount, overlap=seconds)
    when = datetime.datetime.fromtimestamp(rotation.active_from, datetime.UTC).isoformat(timespec="seconds")
    click.echo(f"staged: new CA {rotation.subject} until {rotation.not_after} in {mount}/{rotation.slot}; "
               f"bundles trust it now ({rotation.public_certs} certificates in ca-public); proxies sign "
               f"with it from {when}")


@proxy_group.command("serve", context_settings=CONTEXT)
@click.option("--workers", type=int, default=1, show_default=True, help="worker processes")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]), help="Log level.")
def proxy_serve(workers: int, log_level: str) -> None:
    """Serve the egress proxy (settings from VAULT_ADDR, VALETKEY_* variables; listens on
    VALETKEY_PROXY_LISTEN, default 127.0.0.1:8480)."""
    import uvicorn
    import uvicorn.supervisors
    from uvicorn.config import STARTUP_FAILURE

    from proxy.app import ProxyApp, config
    from proxy.settings import ProxySettings

    try:
        settings = ProxySettings.from_env()
        policies = load_policy_dir(settings.gateway.policy_dir)
    except (SettingsError, PolicyLoadError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    logging.basicConfig(level=log_level.upper(), format="%(message)s", stream=sys.stdout, force=True)
    if workers > 1:
        cfg = config("proxy.app:from_env", settings, log_level, workers)
        cfg.factory = True
        bound = cfg.bind_socket()  # TCP_NODELAY needs IPPROTO_TCP (see ``gateway serve``)
        sock = socket.socket(bound.family, bound.type, socket.IPPROTO_TCP, fileno=bound.detach())
        supervisor = uvicorn.supervisors.Multiprocess(cfg, sockets=[sock])
        supervisor.run()
        if any(worker.process.exitcode == STARTUP_FAILURE for worker in supervisor.processes):
            sys.exit(1)
        return
    app = ProxyApp(settings, policies)
    server = uvicorn.Server(config(app, settings, log_level))
    try:
        server.run()
    except SystemExit:
        if server.started:
            raise
    if not server.started:
        click.echo(f"error: proxy did not start: {app.startup_error or 'see the log above'}", err=True)
        sys.exit(1)
