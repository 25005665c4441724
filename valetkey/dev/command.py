"""``valetkey dev``: the command line of the local stack (``valetkey/dev/stack.py`` runs it)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from contract.errors import ValetkeyError
from policies.load import PolicyLoadError
from valetkey.dev.stack import DevStack
from valetkey.dev.state import DEFAULT_DIR, state_dir


@click.command("dev")
@click.option("--upstreams", default="", help="Comma-separated upstreams [default: all].")
@click.option("--policy-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Your own policies instead of the demo upstreams (their hosts must be reachable).")
@click.option("--state-dir", "state_dir_option", type=click.Path(path_type=Path, file_okay=False),
              default=None,
              help="Logs, tokens and dev.json of this stack; one stack per directory "
                   f"[default: $VALETKEY_DEV_DIR, else ./{DEFAULT_DIR}].")
@click.option("--vault-port", type=int, default=8200, show_default=True, help="OpenBao dev server port.")
@click.option("--redis-port", type=int, default=6379, show_default=True, help="Redis port.")
@click.option("--broker-port", type=int, default=8400, show_default=True, help="Broker port.")
@click.option("--gateway-port", type=int, default=8410, show_default=True,
              help="First gateway port (demo upstreams from this + 100); 0 picks free ports.")
@click.option("--proxy-port", type=int, default=8480, show_default=True,
              help="Egress proxy port; 0 picks a free port.")
@click.option("--no-demo", is_flag=True, help="Do not mint a demo run.")
@click.option("--postgres", is_flag=True,
              help="Also PostgreSQL (Debian's package) with a demo database behind gateway appdb.")
@click.option("--ha", is_flag=True,
              help="High availability: a three-node OpenBao Raft cluster and Redis with a replica and "
                   "three sentinels, on free ports (--vault-port and --redis-port are not used); kill a "
                   "node to watch valetkey fail over.")
@click.option("--ha-redis", type=click.Choice(["sentinel", "cluster"]), default="sentinel", show_default=True,
              help="With --ha: Redis with Sentinel, or a Redis Cluster (three masters, a replica each).")
def dev_command(upstreams: str, policy_dir: Path | None, state_dir_option: Path | None, vault_port: int,
                redis_port: int, broker_port: int, gateway_port: int, proxy_port: int, no_demo: bool,
                postgres: bool, ha: bool, ha_redis: str) -> None:
    """Run the local stack: OpenBao, Redis, bootstrap, demo upstreams, broker, gateways, a demo run."""
    workdir = state_dir(state_dir_option)
    names = tuple(n.strip() for n in upstreams.split(",") if n.strip())
    stack = DevStack(workdir, vault_port, redis_port, broker_port, gateway_port, names, policy_dir,
                     demo=not no_demo, proxy_port=proxy_port, postgres=postgres, ha=ha,
                     ha_redis=ha_redis)
    try:
        stack.run()
    except (ValetkeyError, PolicyLoadError) as exc:
        click.echo(f"error: {getattr(exc, 'detail', exc)}", err=True)
        sys.exit(1)
