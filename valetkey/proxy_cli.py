"""CLI: ``valetkey proxy serve``: the egress proxy (the sandbox's HTTPS_PROXY)."""

from __future__ import annotations

import logging
import socket
import sys

import click

from contract.env import SettingsError
from policies.load import PolicyLoadError, load_policy_dir


@click.group("proxy")
def proxy_group() -> None:
    """The egress proxy: every run's one way out, destinations allowlisted by purpose."""


@proxy_group.command("serve")
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
