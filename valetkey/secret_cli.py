"""``valetkey secret put UPSTREAM``: write an upstream's real secret where its gateway reads it.

The path comes from the upstream's policy (``secret.mount``/``path``/``field``); the value from
stdin or a hidden prompt, never from the command line (it would land in the shell history). The
gateway picks it up at its next refresh (``VALETKEY_SECRET_REFRESH``; 2 s in ``valetkey dev``).
Outside dev, use a Vault token allowed to write that path; in dev the stack's root token is used
when ``VAULT_TOKEN`` is not set.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from policies.load import SHIPPED_POLICY_DIR, PolicyLoadError, load_policy_dir
from valetkey.cli_support import CONTEXT, fail
from valetkey.dev.state import ROOT_TOKEN_FILE, find_running, state_dir


@click.group("secret", context_settings=CONTEXT)
def secret_group() -> None:
    """Write upstream secrets into Vault (where the gateways read them)."""


@secret_group.command("put")
@click.argument("upstream")
@click.option("--policy-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              envvar="VALETKEY_POLICY_DIR",
              help="Policy directory naming the secret's path [env: VALETKEY_POLICY_DIR; default: "
                   "the running dev stack's, else the shipped policies].")
@click.option("--vault-addr", default=None, envvar="VAULT_ADDR", metavar="URL",
              help="Vault address [env: VAULT_ADDR; default: the running dev stack's].")
def secret_put(upstream: str, policy_dir: Path | None, vault_addr: str | None) -> None:
    """Write UPSTREAM's real secret (read from stdin, or a hidden prompt on a terminal)."""
    import hvac
    import hvac.exceptions
    import requests

    dev = find_running()
    directory = policy_dir or (Path(dev.policy_dir) if dev else SHIPPED_POLICY_DIR)
    try:
        policies = load_policy_dir(directory)
    except PolicyLoadError as exc:
        fail(f"policies in {directory}: {exc.problems[0] if exc.problems else exc}")
    up = policies.upstreams.get(upstream)
    if up is None:
        fail(f"no upstream {upstream!r} in {directory}; upstreams: {', '.join(sorted(policies.upstreams))}")
    if up.secret is None:
        fail(f"{upstream} has a {up.credential_source.kind.value} credential source: its gateway issues "
             "credentials itself and reads no KV secret (docs/operations.md, credential sources)")
    addr = (vault_addr or (dev.vault_addr if dev else "")).split(",")[0].strip()  # a cluster: the first
    token = os.environ.get("VAULT_TOKEN", "")
    if not token and dev is not None:
        token = (state_dir() / ROOT_TOKEN_FILE).read_text().strip()
    if not addr or not token:
        fail("set VAULT_ADDR and VAULT_TOKEN (a token allowed to write the secret), or start `valetkey dev`")
    if sys.stdin.isatty():
        value = click.prompt(f"secret for {upstream}", hide_input=True, confirmation_prompt=True)
    else:
        value = sys.stdin.read().strip()
    if not value:
        fail("the secret is empty: pipe it on stdin or type it at the prompt")
    client = hvac.Client(url=addr, token=token, timeout=10)
    try:
        client.secrets.kv.v2.create_or_update_secret(
            path=up.secret.path, mount_point=up.secret.mount, secret={up.secret.field: value}
        )
    except requests.RequestException as exc:
        fail(f"cannot reach Vault at {addr}: {type(exc).__name__}; set VAULT_ADDR or --vault-addr")
    except hvac.exceptions.VaultError as exc:
        fail(f"Vault at {addr} refused to write {up.secret.mount}/{up.secret.path}: {type(exc).__name__} "
             "(is VAULT_TOKEN allowed to write it?)")
    refresh = "within 2s in dev" if dev else "at its next refresh (VALETKEY_SECRET_REFRESH)"
    click.echo(f"wrote the secret of {upstream} to {up.secret.mount}/{up.secret.path} "
               f"(field {up.secret.field}); its gateway uses it {refresh}")
