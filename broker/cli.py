"""The ``valetkey`` command line."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from policies.load import PolicyLoadError, load_policy_dir


@click.group()
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
    for up in policies.upstreams.values():
        flag = "  allow_private: true" if up.allow_private else ""
        click.echo(f"upstream {up.name}: {up.base_url} purposes={sorted(up.purposes)}{flag}")
    for rt in policies.runtimes.values():
        allowed = {k: sorted(v) for k, v in rt.allow.items()}
        click.echo(f"runtime {rt.name}: max_ttl={rt.max_ttl}s allow={allowed}")
    click.echo(f"ok: {len(policies.upstreams)} upstream(s), {len(policies.runtimes)} runtime(s)")
