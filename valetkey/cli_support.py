"""What every command group of the ``valetkey`` CLI shares: one way to fail, the broker's address
and an authenticated client for it, the common options."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import click
import httpx

DEFAULT_BROKER = "http://127.0.0.1:8400"
NO_IDENTITY = ("set VAULT_TOKEN to your Vault token: a runtime's for runs, the security team's for "
              "revocations (valetkey dev writes both into its state directory)")


def fail(message: str) -> NoReturn:
    """The one way a command reports a problem: ``error: ...`` on stderr, exit 1."""
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stdout, force=True)


def broker_url(broker: str | None) -> tuple[str, str]:
    """The broker to talk to and where that address came from (for error messages).

    ``--broker`` or ``VALETKEY_BROKER_URL`` first, then a running ``valetkey dev`` stack's address
    (``dev.json`` in ``$VALETKEY_DEV_DIR`` or ``./.valetkey-dev``), then the default.
    """
    from valetkey.dev.state import find_running

    if broker:
        return broker.rstrip("/"), "from --broker or VALETKEY_BROKER_URL"
    dev = find_running()
    if dev is not None:
        return dev.broker_url, "the running dev stack's, from its dev.json"
    return DEFAULT_BROKER, "the default"


@contextmanager
def broker_client(broker: str | None) -> Iterator[httpx.Client]:
    """An authenticated client; an unreachable broker ends the command with one line, exit 1."""
    url, source = broker_url(broker)
    token = os.environ.get("VAULT_TOKEN", "")
    if not token:
        fail(NO_IDENTITY)
    try:
        with httpx.Client(base_url=url, headers={"X-Vault-Token": token}, timeout=10.0) as client:
            yield client
    except httpx.TransportError as exc:
        fail(f"cannot reach the broker at {url} ({source}): {type(exc).__name__}; start it, or give "
             "its address with --broker URL or VALETKEY_BROKER_URL")


def show(response: httpx.Response) -> dict[str, Any]:
    try:
        body: dict[str, Any] = response.json()
    except ValueError:
        body = {"error": "invalid_response", "detail": response.text[:200]}
    if response.status_code >= 400:
        fail(f"{response.status_code} {body.get('error')}: {body.get('detail')}")
    return body


BROKER_OPTION = click.option(
    "--broker", envvar="VALETKEY_BROKER_URL", default=None, metavar="URL",
    help=f"Broker base URL [env: VALETKEY_BROKER_URL; default: a running `valetkey dev` stack's, "
         f"else {DEFAULT_BROKER}].",
)
JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
# -h as well as --help, on every group and command
CONTEXT: dict[str, Any] = {"help_option_names": ["-h", "--help"]}


def options(*decorators: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Several click options as one decorator, applied in the order listed."""
    def apply(func: Any) -> Any:
        for option in reversed(decorators):
            func = option(func)
        return func
    return apply
