"""CLI commands of the control plane: ``broker serve``, ``run create|show|end``, ``keys ...``."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import click
import httpx
import requests

from broker.settings import BrokerSettings
from contract.env import SettingsError
from policies.load import PolicyLoadError, load_policy_dir


def fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stdout, force=True)


@click.group("broker")
def broker_group() -> None:
    """The control plane."""


@broker_group.command("serve")
@click.option("--log-level", default="info", show_default=True)
def broker_serve(log_level: str) -> None:
    """Serve the broker API (settings from VAULT_ADDR, VAULT_TOKEN, VALETKEY_* variables)."""
    import uvicorn

    from broker.app import create_app

    try:
        settings = BrokerSettings.from_env()
        policies = load_policy_dir(settings.policy_dir)
    except (SettingsError, PolicyLoadError) as exc:
        fail(str(exc))
        return
    configure_logging(log_level.upper())
    app = create_app(settings, policies)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=log_level,
                access_log=False, server_header=False)


def _client(broker: str) -> httpx.Client:
    token = os.environ.get("VAULT_TOKEN", "")
    if not token:
        fail("set VAULT_TOKEN to your Vault token (the runtime's or the security team's)")
    return httpx.Client(base_url=broker, headers={"X-Vault-Token": token}, timeout=10.0)


def _show(response: httpx.Response) -> dict[str, Any]:
    try:
        body: dict[str, Any] = response.json()
    except ValueError:
        body = {"error": "invalid_response", "detail": response.text[:200]}
    if response.status_code >= 400:
        fail(f"{response.status_code} {body.get('error')}: {body.get('detail')}")
    return body


def parse_grant(text: str) -> dict[str, Any]:
    """``UPSTREAM:PURPOSE[:k=v,k=v]`` → grant object."""
    upstream, _, rest = text.partition(":")
    purpose, _, params_text = rest.partition(":")
    if not upstream or not purpose:
        raise click.BadParameter(f"{text!r} is not UPSTREAM:PURPOSE[:k=v,...]")
    params: dict[str, str] = {}
    for item in filter(None, params_text.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"param {item!r} is not k=v")
        params[key] = value
    return {"upstream": upstream, "purpose": purpose, "params": params}


BROKER_OPTION = click.option(
    "--broker", envvar="VALETKEY_BROKER_URL", default="http://127.0.0.1:8400", show_default=True
)


@click.group("run")
def run_group() -> None:
    """Create, inspect and end runs (uses VAULT_TOKEN as the caller identity)."""


@run_group.command("create")
@BROKER_OPTION
@click.option("--grant", "grants", multiple=True, required=True,
              help="UPSTREAM:PURPOSE[:k=v,...], repeatable")
@click.option("--ttl", default=None, help="e.g. 15m; default is the broker's")
@click.option("--format", "fmt", type=click.Choice(["json", "env"]), default="json")
def run_create(broker: str, grants: tuple[str, ...], ttl: str | None, fmt: str) -> None:
    """Mint a run bundle; --format env prints dotenv lines for the sandbox."""
    body: dict[str, Any] = {"grants": [parse_grant(g) for g in grants]}
    if ttl:
        body["ttl"] = ttl
    with _client(broker) as client:
        bundle = _show(client.post("/v1/runs", json=body))
    if fmt == "env":
        click.echo(bundle["dotenv"], nl=False)
    else:
        click.echo(json.dumps(bundle, indent=2))


@run_group.command("show")
@BROKER_OPTION
@click.argument("run_id")
def run_show(broker: str, run_id: str) -> None:
    with _client(broker) as client:
        click.echo(json.dumps(_show(client.get(f"/v1/runs/{run_id}")), indent=2))


@run_group.command("end")
@BROKER_OPTION
@click.argument("run_id")
def run_end(broker: str, run_id: str) -> None:
    """End a run: its tokens stop verifying."""
    with _client(broker) as client:
        record = _show(client.delete(f"/v1/runs/{run_id}"))
    click.echo(f"run {record['run_id']} {record['state']}")


def _hvac() -> Any:
    import hvac

    addr, token = os.environ.get("VAULT_ADDR", ""), os.environ.get("VAULT_TOKEN", "")
    if not addr or not token:
        fail("set VAULT_ADDR and VAULT_TOKEN (a token with the valetkey-admin policy)")
    return hvac.Client(url=addr, token=token)


KEY_OPTIONS = [
    click.option("--mount", default="transit", show_default=True),
    click.option("--key", "key_name", default="valetkey-tokens", show_default=True),
]


def key_options(func: Any) -> Any:
    for option in reversed(KEY_OPTIONS):
        func = option(func)
    return func


@click.group("keys")
def keys_group() -> None:
    """Manage the token signing key in Vault transit."""


def _print_key(client: Any, mount: str, key_name: str) -> None:
    data = client.secrets.transit.read_key(name=key_name, mount_point=mount)["data"]
    low = max(1, int(data.get("min_decryption_version") or 1))
    versions = sorted(int(v) for v in data["keys"])
    live = [v for v in versions if v >= low]
    click.echo(f"key {key_name}: latest v{data['latest_version']}, live versions {live}")


@keys_group.command("rotate")
@key_options
def keys_rotate(mount: str, key_name: str) -> None:
    """Add a new key version; new tokens use it, older live versions still verify."""
    import hvac.exceptions

    client = _hvac()
    try:
        client.secrets.transit.rotate_key(name=key_name, mount_point=mount)
        _print_key(client, mount, key_name)
    except (hvac.exceptions.VaultError, requests.RequestException) as exc:
        fail(f"rotation failed: {type(exc).__name__}")


@keys_group.command("retire")
@key_options
@click.option("--below", type=int, required=True, help="retire every version lower than this")
def keys_retire(mount: str, key_name: str, below: int) -> None:
    """Retire old versions: tokens they signed stop verifying once verifiers refresh the JWKS."""
    import hvac.exceptions

    client = _hvac()
    try:
        client.secrets.transit.update_key_configuration(
            name=key_name, mount_point=mount, min_decryption_version=below
        )
        _print_key(client, mount, key_name)
    except (hvac.exceptions.VaultError, requests.RequestException) as exc:
        fail(f"retire failed: {type(exc).__name__}")


@keys_group.command("list")
@key_options
def keys_list(mount: str, key_name: str) -> None:
    import hvac.exceptions

    try:
        _print_key(_hvac(), mount, key_name)
    except (hvac.exceptions.VaultError, requests.RequestException) as exc:
        fail(f"cannot read key: {type(exc).__name__}")


def _commands() -> list[click.Command]:
    from valetkey.admin_cli import COMMANDS as ADMIN_COMMANDS
    from valetkey.dev.stack import dev_command
    from valetkey.gateway_cli import gateway_group
    from valetkey.selftest import selftest_command

    return [broker_group, run_group, keys_group, dev_command, gateway_group, selftest_command,
            *ADMIN_COMMANDS]


COMMANDS = _commands()
