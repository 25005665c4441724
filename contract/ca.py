"""The deployment CA of the egress proxy: its key and certificate, where they live in Vault, PEM.

Vault KV v2 (mount ``secret`` by default):

* ``valetkey/proxy/ca`` = ``{"cert": PEM, "key": PEM (PKCS8, EC P-256)}``: read only by the
  proxy's identity (Vault policy ``valetkey-proxy``);
* ``valetkey/proxy/ca-next`` = the same shape: the other of the two slots a rotation alternates
  between (a rotation writes the new CA into the slot not signing now, never reading a key);
* ``valetkey/proxy/ca-public`` = ``{"certs": PEM, "slots": JSON}``: the signing certificate
  first, then the other slot's during a rotation; the broker reads it (never a key) for run
  bundles. ``slots`` maps each slot path to its certificate's SHA-256 and the unix time from
  which proxies sign with it (``active_from``): the latest slot already active signs. A rotation
  stages the new CA with ``active_from`` = now + the longest run TTL, so every live run's bundle
  trusts it before any proxy uses it. Without ``slots`` (a CA made before rotations), ``ca`` signs.

A CA is EC P-256, ten years, ``pathLenConstraint=0`` (it signs leaves only) and name-constrained
against every IP address: the proxy never mints for an IP literal, so a leaked CA key cannot
vouch for one either. DNS names are not constrained (destinations change without a new CA).
Leaf minting is the proxy's (``proxy/certs.py``).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from contract.secret import Secret

KV_MOUNT = "secret"
CA_PATH = "valetkey/proxy/ca"
CA_PUBLIC_PATH = "valetkey/proxy/ca-public"
CA_NEXT_PATH = "valetkey/proxy/ca-next"
SLOT_PATHS = (CA_PATH, CA_NEXT_PATH)
CA_LIFETIME = datetime.timedelta(days=3650)
CA_COMMON_NAME = "valetkey egress proxy CA"
PEM_BEGIN = "-----BEGIN CERTIFICATE-----"
MAX_PUBLIC_CERTS = 2  # current + previous


class CAError(ValueError):
    """CA material that cannot be used; the message names what is wrong (never the key)."""


@dataclass(frozen=True)
class CAMaterial:
    cert_pem: str
    key_pem: Secret  # PKCS8 PEM; masked in repr and str

    def kv_data(self) -> dict[str, str]:
        """The ``valetkey/proxy/ca`` secret's data."""
        return {"cert": self.cert_pem, "key": self.key_pem.reveal()}


def kv_api_path(path: str, mount: str = KV_MOUNT) -> str:
    """The KV v2 API path (``secret/data/valetkey/proxy/ca``) of ``path``."""
    return f"{mount}/data/{path}"


def generate_ca(common_name: str = CA_COMMON_NAME, now: datetime.datetime | None = None,
                lifetime: datetime.timedelta = CA_LIFETIME) -> CAMaterial:
    key = ec.generate_private_key(ec.SECP256R1())
    start = (now or datetime.datetime.now(datetime.UTC)) - datetime.timedelta(minutes=5)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "valetkey")])
    no_ip = [x509.IPAddress(ipaddress.ip_network("0.0.0.0/0")),
             x509.IPAddress(ipaddress.ip_network("::/0"))]
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(start + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.NameConstraints(permitted_subtrees=None, excluded_subtrees=no_ip),
                       critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    return CAMaterial(cert_pem=cert_pem(cert), key_pem=Secret(key_pem))


def cert_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def load_certs(pem: str) -> list[x509.Certificate]:
    """Every certificate of a PEM bundle, in order; CAError when there is none or one is bad."""
    if PEM_BEGIN not in pem:
        raise CAError("no PEM certificate")
    try:
        return x509.load_pem_x509_certificates(pem.encode())
    except ValueError as exc:
        raise CAError(f"unreadable PEM certificate ({type(exc).__name__})") from None


def load_ca(material: CAMaterial) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The certificate and key of ``material``, checked: one CA cert, an EC P-256 key, a pair."""
    certs = load_certs(material.cert_pem)
    if len(certs) != 1:
        raise CAError(f"expected one CA certificate, found {len(certs)}")
    try:
        key = serialization.load_pem_private_key(material.key_pem.reveal().encode(), password=None)
    except (ValueError, TypeError):
        raise CAError("the CA key is not an unencrypted PKCS8 PEM key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise CAError("the CA key is not EC P-256")
    if key.public_key() != certs[0].public_key():
        raise CAError("the CA key does not belong to the CA certificate")
    return certs[0], key


def material_from_kv(data: object) -> CAMaterial:
    """``valetkey/proxy/ca``'s data as CAMaterial (checked by ``load_ca``)."""
    if not isinstance(data, dict) or not isinstance(data.get("cert"), str) or not isinstance(
            data.get("key"), str):
        raise CAError("the CA secret has no string fields cert and key")
    material = CAMaterial(cert_pem=data["cert"], key_pem=Secret(data["key"]))
    load_ca(material)
    return material


def public_certs(data: object) -> str:
    """``valetkey/proxy/ca-public``'s ``certs``, checked: 1 or 2 certificates, PEM."""
    if not isinstance(data, dict) or not isinstance(data.get("certs"), str):
        raise CAError("the public CA secret has no string field certs")
    certs = load_certs(data["certs"])
    if len(certs) > MAX_PUBLIC_CERTS:
        raise CAError(f"{len(certs)} public CA certificates; expected current and previous")
    return "".join(cert_pem(c) for c in certs)


def fingerprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex()


def slots_of(data: object) -> dict[str, dict[str, int | str]]:
    """``ca-public``'s ``slots`` (slot path → ``{"sha256", "active_from"}``); ``ca`` active since
    0 when there are none. Garbled slots read as none: ``ca`` signs (what bootstrap created)."""
    raw = data.get("slots") if isinstance(data, dict) else None
    try:
        slots = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        slots = None
    if not isinstance(slots, dict) or not slots:
        return {CA_PATH: {"sha256": "", "active_from": 0}}
    return {path: {"sha256": str(v.get("sha256", "")), "active_from": int(v.get("active_from", 0))}
            for path, v in slots.items() if path in SLOT_PATHS and isinstance(v, dict)
            and isinstance(v.get("active_from", 0), int)} or {CA_PATH: {"sha256": "", "active_from": 0}}


def signing_slot(data: object, now: float) -> str:
    """The slot proxies sign with at ``now``: of the slots already active, the latest."""
    slots = slots_of(data)
    active = [(int(v["active_from"]), path) for path, v in slots.items() if int(v["active_from"]) <= now]
    return max(active)[1] if active else CA_PATH
