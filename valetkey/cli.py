"""The ``valetkey`` command line."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import click

from policies.load import PolicyLoadError, load_policy_dir
from valetkey.cli_support import CONTEXT

# Each command's module is imported when that command runs: a gateway or proxy process started as
# ``valetkey gateway serve`` does not carry the dev stack, the admin and broker clients (hvac,
# requests) in its memory (~8 MB of an idle gateway's RSS, docs/benchmarks.md table 6).
COMMANDS = {
    "broker": "valetkey.broker_cli:broker_group",
    "run": "valetkey.broker_cli:run_group",
    "keys": "valetkey.broker_cli:keys_group",
    "gateway": "valetkey.gateway_cli:gateway_group",
    "proxy": "valetkey.proxy_cli:proxy_group",
    "secret": "valetkey.secret_cli:secret_group",
    "dev": "valetkey.dev.command:dev_command",
    "selftest": "valetkey.selftest:selftest_command",
    "approvals": "valetkey.approvals_cli:approvals_group",
    "revoke": "valetkey.admin_cli:revoke_command",
    "revocations": "valetkey.admin_cli:revocations_command",
    "audit": "valetkey.admin_cli:audit_group",
}


class _Commands(click.Group):
    """``COMMANDS`` loaded by name when asked for (help lists them all)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            module, _, attr = COMMANDS[cmd_name].partition(":")
            self.add_command(getattr(importlib.import_module(module), attr), cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Commands, context_settings=CONTEXT)
@click.version_option(package_name="valetkey", prog_name="valetkey", message="%(prog)s %(version)s")
def main() -> None:
    """valetkey: keep real credentials out of agent sandboxes."""


@main.group()
def policy() -> None:
    """Work with policy files."""


@policy.command("check")
@click.argument("directory", type=click.Path(path_type=Path))
def policy_check(directory: Path) -> None:
    """Validate every policy under DIRECTORY offline; exit 1 listing each problem."""
    try:
        policies = load_policy_dir(directory)
    except PolicyLoadError as exc:
        for problem in exc.problems:
            click.echo(f"error: {problem}", err=True)
        click.echo(f"{len(exc.problems)} problem(s) in {directory}", err=True)
        sys.exit(1)
    if not policies.upstreams and not policies.runtimes and not policies.destinations:
        click.echo(f"error: no policy documents in {directory} (expected *.yaml files with "
                   "kind: upstream, kind: destination or kind: runtime)", err=True)
        sys.exit(1)
    for up in policies.upstreams.values():
        flag = "  allow_private: true" if up.allow_private else ""
        click.echo(f"upstream {up.name}: {up.base_url} purposes={sorted(up.purposes)}{flag}")
    for dest in policies.destinations.values():
        flags = "".join(f"  {flag}" for flag, on in (
            ("allow_private: true", dest.allow_private), (f"ca_file: {dest.ca_file}", dest.ca_file)) if on)
        click.echo(f"destination {dest.name}: {dest.host} ports={sorted(dest.ports)} tls={dest.tls} "
                   f"purposes={sorted(dest.purposes)}{flags}")
    for rt in policies.runtimes.values():
        allowed = {k: sorted(v) for k, v in rt.allow.items()}
        asks = rt.unlisted
        ask = (f"  unlisted_hosts: ask {[str(h) for h in asks.ask]} ports={sorted(asks.ports)} "
               f"timeout={asks.timeout}s" if asks else "")
        click.echo(f"runtime {rt.name}: max_ttl={rt.max_ttl}s allow={allowed}{ask}")
    alerting = policies.alerting
    thresholds = ", ".join(f"{k}={t.count}/{t.window}s" for k, t in alerting.thresholds.items())
    click.echo(f"alerts: {thresholds}; auto_revoke={sorted(k.value for k in alerting.auto_revoke)}"
               + (f"; webhook={alerting.webhook_url}" if alerting.webhook_url else ""))
    click.echo(f"ok: {len(policies.upstreams)} upstream(s), {len(policies.destinations)} "
               f"destination(s), {len(policies.runtimes)} runtime(s)")


@main.group()
def vault() -> None:
    """Set up Vault/OpenBao for valetkey (uses VAULT_ADDR and VAULT_TOKEN)."""


@vault.command("bootstrap")
@click.option(
    "--policy-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Policy directory [default: $VALETKEY_POLICY_DIR, else the shipped policies].",
)
@click.option(
    "--hcl-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Directory of the HCL policy templates [default: the HCL installed with valetkey].",
)
def vault_bootstrap(policy_dir: Path | None, hcl_dir: Path | None) -> None:
    """Create or check mounts, the signing key, ACL policies and roles; safe to run again."""
    import os

    import policies as shipped
    from contract.errors import ValetkeyError
    from valetkey.bootstrap import bootstrap_vault

    directory = policy_dir or Path(
        os.environ.get("VALETKEY_POLICY_DIR") or Path(shipped.__file__).parent
    )
    # a list of cluster nodes (as the broker and gateways take): the first; a standby forwards
    addr = os.environ.get("VAULT_ADDR", "").split(",")[0].strip()
    token = os.environ.get("VAULT_TOKEN", "")
    if not addr or not token:
        click.echo("error: set VAULT_ADDR and VAULT_TOKEN (an operator or root token)", err=True)
        sys.exit(2)
    try:
        loaded = load_policy_dir(directory)
    except PolicyLoadError as exc:
        for problem in exc.problems:
            click.echo(f"error: {problem}", err=True)
        sys.exit(1)
    try:
        from valetkey.bootstrap import HCL_DIR

        report = bootstrap_vault(addr, token, loaded, hcl_dir=hcl_dir or HCL_DIR)
    except ValetkeyError as exc:
        click.echo(f"error: {exc.detail}", err=True)
        sys.exit(1)
    click.echo(f"vault {addr}, policies {directory}")
    for line in report.lines():
        click.echo(line)


if __name__ == "__main__":
    main()
