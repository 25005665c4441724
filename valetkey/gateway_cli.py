"""CLI: ``valetkey gateway serve --upstream NAME``."""

from __future__ import annotations

import logging
import os
import socket
import sys
from typing import TYPE_CHECKING

import click

from contract.env import SettingsError
from policies.load import PolicyLoadError, load_policy_dir

if TYPE_CHECKING:
    from gateways.settings import GatewaySettings
    from policies.model import Upstream


@click.group("gateway")
def gateway_group() -> None:
    """The data plane: one gateway process per upstream."""


@gateway_group.command("serve")
@click.option("--upstream", required=True, help="the upstream this gateway serves (its audience)")
@click.option("--workers", type=int, default=1, show_default=True, help="worker processes")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]), help="Log level.")
def gateway_serve(upstream: str, workers: int, log_level: str) -> None:
    """Serve one upstream (settings from VAULT_ADDR, VALETKEY_* variables)."""
    import uvicorn
    import uvicorn.supervisors
    from uvicorn.config import STARTUP_FAILURE

    from gateways.app import GatewayApp
    from gateways.server import config
    from gateways.settings import GatewaySettings

    try:
        settings = GatewaySettings.from_env(upstream)
        policies = load_policy_dir(settings.policy_dir)
    except (SettingsError, PolicyLoadError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    if upstream not in policies.upstreams:
        click.echo(f"error: no upstream {upstream!r} in {settings.policy_dir}; "
                   f"known: {sorted(policies.upstreams)}", err=True)
        sys.exit(1)
    logging.basicConfig(level=log_level.upper(), format="%(message)s", stream=sys.stdout, force=True)
    if policies.upstreams[upstream].protocol == "postgres":
        _serve_postgres(settings, policies.upstreams[upstream], workers)
        return
    if workers > 1:
        # each worker process builds its own app from the environment (uvicorn's factory mode)
        os.environ["VALETKEY_GATEWAY_UPSTREAM"] = upstream
        cfg = config("gateways.server:from_env", settings, log_level, workers)
        cfg.factory = True
        # uvicorn binds with proto=0, and asyncio then leaves Nagle on for accepted connections
        # (40 ms stalls on keep-alive); rewrap the socket as IPPROTO_TCP so TCP_NODELAY applies
        bound = cfg.bind_socket()
        sock = socket.socket(bound.family, bound.type, socket.IPPROTO_TCP, fileno=bound.detach())
        supervisor = uvicorn.supervisors.Multiprocess(cfg, sockets=[sock])
        supervisor.run()
        # a worker whose start-up failed stops the supervisor, which then returns normally
        if any(worker.process.exitcode == STARTUP_FAILURE for worker in supervisor.processes):
            sys.exit(1)
        return
    app = GatewayApp(settings, policies.upstreams[upstream], alerting=policies.alerting,
                     enterprise=policies.enterprise)
    server = uvicorn.Server(config(app, settings, log_level))
    try:
        server.run()
    except SystemExit:  # uvicorn's own code for a failed start-up is 3; ours is documented as 1
        if server.started:
            raise
    if not server.started:
        click.echo(f"error: gateway did not start: {app.startup_error or 'see the log above'}", err=True)
        sys.exit(1)


def _serve_postgres(settings: GatewaySettings, upstream: Upstream, workers: int) -> None:
    """The Postgres gateway: one asyncio process (no uvicorn); run replicas for more."""
    import asyncio

    from contract.errors import ValetkeyError
    from gateways.pg_gateway import serve

    if workers != 1:
        click.echo("error: a postgres gateway runs one worker per process; run more replicas instead",
                   err=True)
        sys.exit(1)
    try:
        asyncio.run(serve(settings, upstream))
    except KeyboardInterrupt:
        return
    except (ValetkeyError, SettingsError, OSError) as exc:
        detail = exc.detail if isinstance(exc, ValetkeyError) else str(exc)
        click.echo(f"error: gateway did not start: {detail}", err=True)
        sys.exit(1)
