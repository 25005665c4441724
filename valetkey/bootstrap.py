"""``valetkey vault bootstrap``: set up a Vault/OpenBao for valetkey, idempotently, with hvac.

What it ensures (``created`` when missing, ``updated`` when valetkey's own object drifted,
``present`` when already right; running it twice changes nothing):

  mounts       KV v2 at ``secret`` (and any other mount an upstream's secret names), transit at
               ``transit``, AppRole auth at ``approle``; a mount of the wrong type is an error
  transit key  ``valetkey-tokens``, ed25519; never recreated, a key of another type is an error
  policies     valetkey-broker, valetkey-admin, valetkey-run, valetkey-runtime and
               valetkey-gateway-<upstream> (read of that upstream's secret, nothing else), from the
               HCL in ``valetkey/hcl/`` (package data); each runtime's own ``vault_policy`` is created from
               ``runtime.hcl`` when missing and never overwritten (it may be the operator's)
  roles        AppRole valetkey-broker, valetkey-gateway-<upstream>, valetkey-proxy and each
               runtime's ``approle_role``; token role valetkey-run (orphan, not renewable) for
               per-run tokens
  proxy CA     the egress proxy's deployment CA and its public certificates, and the policy
               valetkey-proxy (``valetkey/proxy_bootstrap.py``)

Foreign errors (hvac, requests) are translated into the valetkey family; no token is in a message.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from string import Template
from typing import Any

import hvac
import hvac.exceptions

from contract.errors import BadRequest, Reason, Unauthenticated, Unavailable, UpstreamError
from policies.model import PolicySet
from valetkey.proxy_bootstrap import PROXY_POLICY, PROXY_ROLE, ca_paths, ensure_ca, proxy_rules

HCL_DIR = Path(__file__).resolve().parent / "hcl"  # package data: installed with valetkey
BROKER_POLICY = "valetkey-broker"
ADMIN_POLICY = "valetkey-admin"
RUN_POLICY = "valetkey-run"
RUNTIME_POLICY = "valetkey-runtime"
GATEWAY_PREFIX = "valetkey-gateway-"
SERVICE_TOKEN_TTL = 3600  # broker and gateway AppRole tokens; the services renew them
SERVICE_TOKEN_MAX_TTL = 86400
RUNTIME_TOKEN_TTL = 900  # a runtime's token only has to last until it has asked for a run
RUNTIME_TOKEN_MAX_TTL = 3600
DEFAULT_RUN_MAX_TTL = 3600
# Vault lower-cases policy names and puts role names in URLs: keep both to a plain alphabet.
VAULT_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,127}$")
RESERVED_POLICIES = frozenset({"root", "default", BROKER_POLICY, ADMIN_POLICY, RUN_POLICY,
                               RUNTIME_POLICY, PROXY_POLICY})


def gateway_name(upstream: str) -> str:
    """The policy and AppRole role of the gateway for ``upstream``."""
    return f"{GATEWAY_PREFIX}{upstream}"


class Action(StrEnum):
    CREATED = "created"
    UPDATED = "updated"
    PRESENT = "present"


@dataclass(frozen=True)
class Step:
    kind: str  # mount, auth, transit key, policy, approle role, token role
    name: str
    action: Action


@dataclass
class BootstrapReport:
    steps: list[Step] = field(default_factory=list)

    def add(self, kind: str, name: str, action: Action) -> None:
        self.steps.append(Step(kind, name, action))

    def with_action(self, action: Action) -> list[Step]:
        return [s for s in self.steps if s.action is action]

    @property
    def changed(self) -> bool:
        return any(s.action is not Action.PRESENT for s in self.steps)

    def lines(self) -> list[str]:
        out = [f"{s.action.value:<8} {s.kind:<13} {s.name}" for s in self.steps]
        counts = ", ".join(f"{len(self.with_action(a))} {a.value}" for a in Action)
        out.append(f"ok: {counts}")
        return out


@dataclass(frozen=True)
class Layout:
    """Mount and object names; the defaults are what the rest of valetkey expects."""

    kv_mount: str = "secret"
    transit_mount: str = "transit"
    key_name: str = "valetkey-tokens"
    approle_mount: str = "approle"
    run_role: str = "valetkey-run"


@contextmanager
def open_client(addr: str, token: str, timeout: float = 10.0) -> Iterator[Any]:
    """An ``hvac.Client`` whose HTTP session is closed on exit."""
    client = hvac.Client(url=addr, token=token, timeout=timeout)
    try:
        yield client
    finally:
        client.adapter.close()


@contextmanager
def vault_errors(addr: str, action: str) -> Iterator[None]:
    """Translate hvac and transport errors raised while doing ``action``."""
    try:
        yield
    except (hvac.exceptions.Forbidden, hvac.exceptions.Unauthorized) as exc:
        raise Unauthenticated(
            f"Vault at {addr} refused the token while trying to {action}: the token is invalid, "
            "expired or lacks the rights bootstrap needs (use a root or operator token)",
        ) from exc
    except (hvac.exceptions.VaultDown, hvac.exceptions.VaultNotInitialized) as exc:
        raise Unavailable(f"Vault at {addr} is sealed or not initialised ({action})") from exc
    except hvac.exceptions.VaultError as exc:
        raise UpstreamError(f"Vault at {addr} failed to {action}: {exc}") from exc
    except OSError as exc:  # requests' errors are OSErrors
        raise Unavailable(
            f"Vault unreachable at {addr} while trying to {action}: {type(exc).__name__}",
            Reason.VAULT_UNAVAILABLE,
        ) from exc


def bootstrap_vault(
    addr: str, token: str, policies: PolicySet, layout: Layout | None = None, hcl_dir: Path = HCL_DIR
) -> BootstrapReport:
    """Open a client on ``addr`` with ``token`` and run ``bootstrap``."""
    with open_client(addr, token) as client:
        return bootstrap(client, policies, layout, hcl_dir)


def bootstrap(
    client: Any, policies: PolicySet, layout: Layout | None = None, hcl_dir: Path = HCL_DIR
) -> BootstrapReport:
    """Bring ``client``'s Vault in line with ``policies``; see the module docstring."""
    lay = layout or Layout()
    _check_names(policies, lay)
    documents = _policy_documents(policies, lay, hcl_dir)  # a bad template fails before any write
    addr = str(client.url)
    report = BootstrapReport()
    with vault_errors(addr, "look up its own token"):
        client.auth.token.lookup_self()
    kv_mounts = sorted({lay.kv_mount} | {u.secret.mount for u in policies.upstreams.values()})
    with vault_errors(addr, "set up secrets engines"):
        for mount in kv_mounts:
            _ensure_engine(client, report, mount, "kv", {"version": "2"})
        _ensure_engine(client, report, lay.transit_mount, "transit", {})
        _ensure_transit_key(client, report, lay)
    with vault_errors(addr, "create the proxy CA"):
        ensure_ca(client, report, lay.kv_mount, Action)
    with vault_errors(addr, "enable AppRole auth"):
        _ensure_approle_auth(client, report, lay.approle_mount)
    with vault_errors(addr, "write ACL policies"):
        for name, hcl, own in documents:
            _ensure_policy(client, report, name, hcl, own)
    with vault_errors(addr, "write AppRole and token roles"):
        service_ttls = {"token_ttl": SERVICE_TOKEN_TTL, "token_max_ttl": SERVICE_TOKEN_MAX_TTL}
        _ensure_approle(client, report, lay, BROKER_POLICY, [BROKER_POLICY], service_ttls)
        _ensure_approle(client, report, lay, PROXY_ROLE, [PROXY_POLICY], service_ttls)
        for up in policies.upstreams.values():
            name = gateway_name(up.name)
            _ensure_approle(client, report, lay, name, [name], service_ttls)
        runtime_ttls = {"token_ttl": RUNTIME_TOKEN_TTL, "token_max_ttl": RUNTIME_TOKEN_MAX_TTL}
        for rt in policies.runtimes.values():
            if rt.identity.approle_role:
                _ensure_approle(
                    client, report, lay, rt.identity.approle_role, [RUNTIME_POLICY], runtime_ttls
                )
        run_max_ttl = max((rt.max_ttl for rt in policies.runtimes.values()),
                          default=DEFAULT_RUN_MAX_TTL)
        _ensure_run_role(client, report, lay.run_role, run_max_ttl)
    return report


def _policy_documents(
    policies: PolicySet, lay: Layout, hcl_dir: Path
) -> list[tuple[str, str, bool]]:
    """(policy name, HCL, owned by valetkey) for every ACL policy bootstrap ensures."""
    names = {"transit": lay.transit_mount, "key": lay.key_name, "run_role": lay.run_role,
             **ca_paths(lay.kv_mount)}
    runtime_hcl = _read(hcl_dir, "runtime.hcl")
    docs = [
        (BROKER_POLICY, _render(hcl_dir, "broker.hcl.tmpl", names), True),
        (ADMIN_POLICY, _render(hcl_dir, "admin.hcl.tmpl", names), True),
        (RUN_POLICY, _read(hcl_dir, "run.hcl"), True),
        (RUNTIME_POLICY, runtime_hcl, True),
        (PROXY_POLICY, _render(hcl_dir, "proxy.hcl.tmpl",
                               {**ca_paths(lay.kv_mount), "upstream_rules": proxy_rules(policies)}), True),
    ]
    for up in policies.upstreams.values():
        values = {"upstream": up.name, "secret_path": up.secret.api_path}
        docs.append((gateway_name(up.name), _render(hcl_dir, "gateway.hcl.tmpl", values), True))
    # A runtime's own policy may be the operator's: created when missing, never overwritten.
    docs.extend(
        (rt.identity.vault_policy, runtime_hcl, False)
        for rt in policies.runtimes.values()
        if rt.identity.vault_policy
    )
    return docs


def _check_names(policies: PolicySet, lay: Layout) -> None:
    """Refuse names that would collide with valetkey's own objects or break a Vault URL."""
    for value in (lay.kv_mount, lay.transit_mount, lay.key_name, lay.approle_mount, lay.run_role):
        if not VAULT_NAME.fullmatch(value):
            raise BadRequest(f"Vault name {value!r} must match {VAULT_NAME.pattern}")
    own_roles = {BROKER_POLICY, PROXY_ROLE} | {gateway_name(u) for u in policies.upstreams}
    for rt in policies.runtimes.values():
        ident = rt.identity
        for kind, value, reserved in (
            ("vault_policy", ident.vault_policy, RESERVED_POLICIES | own_roles),
            ("approle_role", ident.approle_role, own_roles),
        ):
            if not value:
                continue
            where = f"runtime {rt.name} identity {kind} {value!r} ({rt.source})"
            if not VAULT_NAME.fullmatch(value):
                raise BadRequest(f"{where} must match {VAULT_NAME.pattern}; rename it")
            if value in reserved or value.startswith(GATEWAY_PREFIX):
                raise BadRequest(f"{where} is one of valetkey's own names; give the runtime its own")


def _read(hcl_dir: Path, name: str) -> str:
    try:
        return (hcl_dir / name).read_text(encoding="utf-8")
    except OSError as exc:
        raise BadRequest(f"cannot read policy file {hcl_dir / name}: {exc}") from exc


def _render(hcl_dir: Path, name: str, values: dict[str, str]) -> str:
    try:
        return Template(_read(hcl_dir, name)).substitute(values)
    except (KeyError, ValueError) as exc:
        raise BadRequest(f"policy template {hcl_dir / name} has a bad placeholder: {exc}") from exc


def _missing(read: Callable[[], Any]) -> Any | None:
    """``read()``'s answer, or ``None`` when Vault says the object does not exist."""
    try:
        return read()
    except hvac.exceptions.InvalidPath:
        return None


def _ensure_engine(
    client: Any, report: BootstrapReport, mount: str, kind: str, options: dict[str, str]
) -> None:
    mounts = client.sys.list_mounted_secrets_engines()["data"]
    current = mounts.get(f"{mount}/")
    wanted = "kv v2" if kind == "kv" else kind
    if current is None:
        client.sys.enable_secrets_engine(backend_type=kind, path=mount, options=options or None)
        report.add("mount", f"{mount}/ ({wanted})", Action.CREATED)
        return
    found = str(current.get("type"))
    if found == "kv":
        found += f" v{(current.get('options') or {}).get('version', '1')}"
    if found != wanted:
        hint = "; `bao kv enable-versioning` upgrades a kv v1 mount" if kind == "kv" else ""
        raise BadRequest(f"mount {mount}/ is {found}, valetkey needs {wanted}{hint}")
    report.add("mount", f"{mount}/ ({wanted})", Action.PRESENT)


def _ensure_transit_key(client: Any, report: BootstrapReport, lay: Layout) -> None:
    label = f"{lay.transit_mount}/keys/{lay.key_name}"
    current = _missing(
        lambda: client.secrets.transit.read_key(name=lay.key_name, mount_point=lay.transit_mount)
    )
    if current is None:
        client.secrets.transit.create_key(
            name=lay.key_name, key_type="ed25519", mount_point=lay.transit_mount
        )
        report.add("transit key", label, Action.CREATED)
        return
    key_type = current["data"].get("type")
    if key_type != "ed25519":
        raise BadRequest(
            f"transit key {label} is {key_type}, valetkey signs with ed25519; "
            "valetkey never recreates a key: pick another key name or remove it yourself"
        )
    report.add("transit key", label, Action.PRESENT)


def _ensure_approle_auth(client: Any, report: BootstrapReport, mount: str) -> None:
    methods = client.sys.list_auth_methods()["data"]
    current = methods.get(f"{mount}/")
    if current is None:
        client.sys.enable_auth_method(method_type="approle", path=mount)
        report.add("auth", f"{mount}/ (approle)", Action.CREATED)
    elif current.get("type") != "approle":
        raise BadRequest(f"auth mount {mount}/ is {current.get('type')}, valetkey needs approle")
    else:
        report.add("auth", f"{mount}/ (approle)", Action.PRESENT)


def _ensure_policy(client: Any, report: BootstrapReport, name: str, hcl: str, own: bool) -> None:
    current = _missing(lambda: client.sys.read_acl_policy(name=name))
    if current is not None:
        text = str(current["data"].get("policy", ""))
        if not own or text.strip() == hcl.strip():
            report.add("policy", name, Action.PRESENT)
            return
    client.sys.create_or_update_acl_policy(name=name, policy=hcl)
    report.add("policy", name, Action.CREATED if current is None else Action.UPDATED)


def _drifted(current: dict[str, Any], wanted: dict[str, Any]) -> bool:
    def norm(value: Any) -> Any:
        return sorted(value) if isinstance(value, list) else value

    return any(norm(current.get(k)) != norm(v) for k, v in wanted.items())


def _ensure_approle(
    client: Any,
    report: BootstrapReport,
    lay: Layout,
    role: str,
    token_policies: list[str],
    ttls: dict[str, int],
) -> None:
    wanted: dict[str, Any] = {"token_policies": token_policies, "token_type": "service", **ttls}
    approle = client.auth.approle
    current = _missing(lambda: approle.read_role(role_name=role, mount_point=lay.approle_mount))
    if current is not None and not _drifted(current["data"], wanted):
        report.add("approle role", role, Action.PRESENT)
        return
    approle.create_or_update_approle(role_name=role, mount_point=lay.approle_mount, **wanted)
    report.add("approle role", role, Action.CREATED if current is None else Action.UPDATED)


def _ensure_run_role(client: Any, report: BootstrapReport, role: str, max_ttl: int) -> None:
    wanted: dict[str, Any] = {
        "allowed_policies": [RUN_POLICY],
        "orphan": True,
        "renewable": False,
        "token_explicit_max_ttl": max_ttl,
        "token_no_default_policy": True,
        "token_type": "service",
    }
    path = f"/v1/auth/token/roles/{role}"
    current = _missing(lambda: client.adapter.get(path))
    if current is not None and not _drifted(current["data"], wanted):
        report.add("token role", role, Action.PRESENT)
        return
    client.adapter.post(path, json=wanted)
    report.add("token role", role, Action.CREATED if current is None else Action.UPDATED)
