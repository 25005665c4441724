"""The egress proxy's part of ``valetkey vault bootstrap``, and CA rotation (hvac).

* the deployment CA at ``secret/valetkey/proxy/ca`` (created when absent, never replaced:
  ``valetkey proxy ca rotate`` does that) and its public certificates at ``.../ca-public``
  (repaired when missing or not starting with the current certificate);
* the ACL policy ``valetkey-proxy``: read the CA, and read every credentialed upstream's secret
  of the loaded policy set, nothing else (AppRole ``valetkey-proxy`` holds it).

Writes use KV v2 check-and-set, so two bootstraps racing on an empty Vault create one CA.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Protocol

import hvac.exceptions

from contract.ca import (
    CA_NEXT_PATH,
    CA_PATH,
    CA_PUBLIC_PATH,
    SLOT_PATHS,
    CAError,
    cert_pem,
    fingerprint,
    generate_ca,
    kv_api_path,
    load_certs,
    material_from_kv,
    public_certs,
    signing_slot,
    slots_of,
)
from contract.errors import BadRequest
from policies.model import PolicySet

PROXY_POLICY = "valetkey-proxy"
PROXY_ROLE = "valetkey-proxy"


class _Report(Protocol):
    def add(self, kind: str, name: str, action: Any) -> None: ...


def ca_paths(kv_mount: str) -> dict[str, str]:
    """The HCL placeholders of the CA's KV paths (two slots and the public certificates)."""
    return {"ca_path": kv_api_path(CA_PATH, kv_mount), "ca_next_path": kv_api_path(CA_NEXT_PATH, kv_mount),
            "ca_public_path": kv_api_path(CA_PUBLIC_PATH, kv_mount)}


def proxy_rules(policies: PolicySet) -> str:
    """One read rule per distinct upstream secret path, sorted (a stable policy text)."""
    paths = sorted({u.secret.api_path for u in policies.upstreams.values()})
    return "".join(f'path "{p}" {{\n  capabilities = ["read"]\n}}\n' for p in paths)


def _read(client: Any, mount: str, path: str) -> dict[str, Any] | None:
    try:
        answer = client.secrets.kv.v2.read_secret_version(
            path=path, mount_point=mount, raise_on_deleted_version=True)
    except hvac.exceptions.InvalidPath:
        return None
    data = answer["data"]["data"]
    return data if isinstance(data, dict) else None


def _write(client: Any, mount: str, path: str, data: dict[str, str], cas: int | None = None) -> None:
    client.secrets.kv.v2.create_or_update_secret(path=path, secret=data, cas=cas, mount_point=mount)


def ensure_ca(client: Any, report: _Report, kv_mount: str, actions: Any) -> None:
    """Create the CA when absent; make ``ca-public`` start with the current certificate."""
    current = _read(client, kv_mount, CA_PATH)
    if current is None:
        material = generate_ca()
        # public first: a bundle minted from now on already trusts what the proxy will sign with
        _write(client, kv_mount, CA_PUBLIC_PATH, {"certs": material.cert_pem})
        try:
            _write(client, kv_mount, CA_PATH, material.kv_data(), cas=0)
        except hvac.exceptions.InvalidRequest:  # another bootstrap created it first: keep theirs
            current = _read(client, kv_mount, CA_PATH)
        else:
            report.add("proxy CA", f"{kv_mount}/{CA_PATH}", actions.CREATED)
            report.add("proxy CA", f"{kv_mount}/{CA_PUBLIC_PATH}", actions.CREATED)
            return
    try:
        cert = material_from_kv(current).cert_pem
    except CAError as exc:
        raise BadRequest(f"the proxy CA at {kv_mount}/{CA_PATH} is unusable ({exc}); fix or "
                         "delete it (valetkey never replaces a CA except by `proxy ca rotate`)") from None
    report.add("proxy CA", f"{kv_mount}/{CA_PATH}", actions.PRESENT)
    public = _read(client, kv_mount, CA_PUBLIC_PATH)
    try:
        shown = public_certs(public)
    except CAError:
        shown = ""
    if cert in shown:  # first, or second while a rotation's other slot signs or is staged
        report.add("proxy CA", f"{kv_mount}/{CA_PUBLIC_PATH}", actions.PRESENT)
        return
    _write(client, kv_mount, CA_PUBLIC_PATH, {"certs": cert})
    report.add("proxy CA", f"{kv_mount}/{CA_PUBLIC_PATH}",
               actions.CREATED if public is None else actions.UPDATED)


@dataclass(frozen=True)
class Rotation:
    subject: str
    not_after: str
    public_certs: int  # certificates now in ca-public (the signing one and the staged one)
    active_from: int  # unix time from which proxies sign with the new CA
    slot: str


def rotate_ca(client: Any, kv_mount: str = "secret", overlap: int = 0, now: float | None = None) -> Rotation:
    """Stage a new CA in the slot that is not signing now, trusted by every bundle minted from
    now on, and signing from ``now + overlap`` (give the longest run TTL: runs minted before
    the rotation trust only the old CA, and end before proxies switch). Never reads a key: needs
    write on both slots and read/write on ``ca-public`` (valetkey-admin, or an operator token)."""
    when = int(time.time() if now is None else now)
    public = _read(client, kv_mount, CA_PUBLIC_PATH)
    try:
        current = load_certs(public_certs(public)) if public is not None else []
    except CAError:
        current = []
    slots = slots_of(public)
    signing = signing_slot(public, when)
    if not slots[signing].get("sha256") and current:  # a CA from before rotations: its own cert
        slots[signing] = {"sha256": fingerprint(current[0]), "active_from": 0}
    keep = [c for c in current if fingerprint(c) == slots[signing]["sha256"]][:1] or current[:1]
    target = next(path for path in SLOT_PATHS if path != signing)
    material = generate_ca()
    new = load_certs(material.cert_pem)[0]
    slots = {signing: slots[signing], target: {"sha256": fingerprint(new), "active_from": when + overlap}}
    _write(client, kv_mount, target, material.kv_data())  # the key first: no proxy trusts ca-public alone
    certs = "".join(cert_pem(c) for c in keep) + material.cert_pem
    _write(client, kv_mount, CA_PUBLIC_PATH, {"certs": certs, "slots": json.dumps(slots, sort_keys=True)})
    return Rotation(subject=new.subject.rfc4514_string(), not_after=new.not_valid_after_utc.isoformat(),
                    public_certs=len(load_certs(certs)), active_from=when + overlap, slot=target)


def read_public(client: Any, kv_mount: str = "secret") -> str:
    """The PEM of ``ca-public`` (current first); BadRequest when absent or unusable."""
    try:
        return public_certs(_read(client, kv_mount, CA_PUBLIC_PATH))
    except CAError as exc:
        raise BadRequest(f"no usable proxy CA at {kv_mount}/{CA_PUBLIC_PATH} ({exc}); run "
                         "`valetkey vault bootstrap`") from None
