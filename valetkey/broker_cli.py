"""CLI commands of the control plane: ``broker serve``, ``run create|show|end``, ``keys ...``."""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath
from typing import Any

import click
import httpx
import requests

from broker.settings import BrokerSettings
from contract.env import SettingsError
from policies.load import PolicyLoadError, load_policy_dir
from valetkey.cli_support import (
    BROKER_OPTION,
    CONTEXT,
    JSON_OPTION,
    broker_client,
    configure_logging,
    fail,
    options,
    show,
)


@click.group("broker", context_settings=CONTEXT)
def broker_group() -> None:
    """The control plane."""


@broker_group.command("serve")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]), help="Log level.")
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
    refused = vault_token_refused(settings.vault_addr, settings.vault_token.reveal())
    if refused:
        fail(refused)
    configure_logging(log_level.upper())
    app = create_app(settings, policies)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=log_level,
                access_log=False, server_header=False)


def vault_token_refused(addr: str, token: str) -> str:
    """Why the broker must not start with this VAULT_TOKEN, or "" (also when Vault is unreachable:
    then the broker starts and /readyz reports it until Vault answers)."""
    try:
        answer = httpx.get(f"{addr}/v1/auth/token/lookup-self", headers={"X-Vault-Token": token}, timeout=5)
    except httpx.TransportError:
        return ""
    if answer.status_code in (401, 403):
        return (f"Vault at {addr} refused the broker's VAULT_TOKEN ({answer.status_code}): give the broker "
                "its own valid token (policy valetkey-broker); not starting, since every caller would "
                "otherwise be told its own token is invalid")
    return ""


def parse_grant(text: str) -> dict[str, Any]:
    """``UPSTREAM:PURPOSE[:k=v,k=v]`` → grant object (UPSTREAM may name a destination)."""
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


@click.group("run", context_settings=CONTEXT)
def run_group() -> None:
    """Create, inspect and end runs (uses VAULT_TOKEN as the caller identity)."""


@run_group.command("create")
@BROKER_OPTION
@click.option("--grant", "grants", multiple=True, required=True,
              help="UPSTREAM:PURPOSE[:k=v,...], repeatable.")
@click.option("--ttl", default=None, help="Run lifetime, e.g. 15m [default: the broker's].")
@click.option("--format", "fmt", type=click.Choice(["json", "env"]), default="json", show_default=True,
              help="json: the whole bundle; env: dotenv lines for the sandbox.")
@click.option("--files-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              metavar="DIR", help="Write the bundle's files (the proxy CA) under DIR and point the "
                                  "env variables that name them there.")
def run_create(broker: str | None, grants: tuple[str, ...], ttl: str | None, fmt: str,
               files_dir: Path | None) -> None:
    """Mint a run bundle with a runtime's VAULT_TOKEN (UPSTREAM may name a destination)."""
    body: dict[str, Any] = {"grants": [parse_grant(g) for g in grants]}
    if ttl:
        body["ttl"] = ttl
    with broker_client(broker) as client:
        bundle = show(client.post("/v1/runs", json=body))
    if files_dir is not None:
        bundle = write_files(bundle, files_dir)
    if fmt == "env":
        click.echo(bundle["dotenv"], nl=False)
    else:
        click.echo(json.dumps(bundle, indent=2))


def write_files(bundle: dict[str, Any], directory: Path) -> dict[str, Any]:
    """Write each of the bundle's files at DIR/<its path>; the env variables naming a file (the CA
    variables) and the dotenv are rewritten to the written paths."""
    from broker.bundle import dotenv

    moved: dict[str, str] = {}
    for path, content in (bundle.get("files") or {}).items():
        parts = PurePosixPath(path).parts
        if not PurePosixPath(path).is_absolute() or ".." in parts or len(parts) < 2:
            fail(f"the bundle names a file at {path!r}, which is not an absolute path")
        target = directory.joinpath(*parts[1:])
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
        except OSError as exc:
            fail(f"cannot write {target}: {exc.strerror or type(exc).__name__}")
        moved[path] = str(target.resolve())
    env = {key: moved.get(value, value) for key, value in bundle["env"].items()}
    return {**bundle, "env": env, "dotenv": dotenv(env),
            "files": {moved[p]: c for p, c in (bundle.get("files") or {}).items()}}


@run_group.command("show")
@BROKER_OPTION
@JSON_OPTION
@click.argument("run_id")
def run_show(broker: str | None, as_json: bool, run_id: str) -> None:
    """A run's state (active, ended, expired or revoked), grants and expiry."""
    with broker_client(broker) as client:
        record = show(client.get(f"/v1/runs/{run_id}"))
    if as_json:
        click.echo(json.dumps(record, indent=2))
        return
    click.echo(render_run(record))


def render_run(record: dict[str, Any]) -> str:
    import time

    def when(epoch: Any) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(epoch))) if epoch else "-"

    rows = [("run", record.get("run_id")), ("runtime", record.get("runtime")),
            ("state", record.get("state")), ("created", when(record.get("created"))),
            ("expires", when(record.get("expires")))]
    if record.get("ended_at"):
        rows.append(("ended", f"{when(record.get('ended_at'))} by {record.get('ended_by')}"))
    if record.get("why"):
        rows.append(("why", record.get("why")))
    for grant in record.get("grants") or []:
        params = ",".join(f"{k}={v}" for k, v in sorted((grant.get("params") or {}).items()))
        rows.append(("grant", f"{grant.get('upstream')}:{grant.get('purpose')}"
                              + (f":{params}" if params else "")))
    return "\n".join(f"{k:<8} {v}" for k, v in rows)


@run_group.command("end")
@BROKER_OPTION
@JSON_OPTION
@click.argument("run_id")
def run_end(broker: str | None, as_json: bool, run_id: str) -> None:
    """End a run: its tokens stop verifying."""
    with broker_client(broker) as client:
        record = show(client.delete(f"/v1/runs/{run_id}"))
    click.echo(json.dumps(record, indent=2) if as_json else f"run {record['run_id']} {record['state']}")


def _hvac() -> Any:
    import hvac

    addr, token = vault_addr(), os.environ.get("VAULT_TOKEN", "")
    if not addr or not token:
        fail("set VAULT_ADDR and VAULT_TOKEN (a token with the valetkey-admin policy)")
    return hvac.Client(url=addr, token=token, timeout=10)


def vault_addr() -> str:
    """``VAULT_ADDR``, else a running ``valetkey dev`` stack's Vault, else ""."""
    from valetkey.dev.state import find_running

    dev = find_running()
    return os.environ.get("VAULT_ADDR") or (dev.vault_addr if dev else "")


def vault_failure(action: str, exc: Exception) -> str:
    """One line for a failed Vault call: unreachable names VAULT_ADDR, refused names the token."""
    addr = vault_addr()
    if isinstance(exc, requests.RequestException):
        return f"{action}: cannot reach Vault at {addr} ({type(exc).__name__}); check VAULT_ADDR"
    return (f"{action}: Vault at {addr} refused ({type(exc).__name__}); VAULT_TOKEN needs the "
            "valetkey-admin policy")


key_options = options(
    click.option("--mount", default="transit", show_default=True, help="Vault transit mount."),
    click.option("--key", "key_name", default="valetkey-tokens", show_default=True,
                 help="Transit key that signs run tokens."),
)


@click.group("keys", context_settings=CONTEXT)
def keys_group() -> None:
    """Manage the token signing key in Vault transit.

    Uses VAULT_ADDR (else a running `valetkey dev` stack's Vault) and VAULT_TOKEN (the admin token)."""


def _print_key(client: Any, mount: str, key_name: str, as_json: bool = False) -> None:
    data = client.secrets.transit.read_key(name=key_name, mount_point=mount)["data"]
    low = max(1, int(data.get("min_decryption_version") or 1))
    versions = sorted(int(v) for v in data["keys"])
    live = [v for v in versions if v >= low]
    if as_json:
        click.echo(json.dumps({"key": key_name, "mount": mount, "latest_version": int(data["latest_version"]),
                               "live_versions": live, "retired_versions": [v for v in versions if v < low]}))
        return
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
        fail(vault_failure("rotation failed", exc))


@keys_group.command("retire")
@key_options
@click.option("--below", type=int, required=True, help="Retire every version lower than this.")
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
        fail(vault_failure("retire failed", exc))


@keys_group.command("list")
@key_options
@JSON_OPTION
def keys_list(mount: str, key_name: str, as_json: bool) -> None:
    """The signing key's latest and live versions."""
    import hvac.exceptions

    try:
        _print_key(_hvac(), mount, key_name, as_json)
    except (hvac.exceptions.VaultError, requests.RequestException) as exc:
        fail(vault_failure("cannot read the key", exc))


