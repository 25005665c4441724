"""The test CA of table 7 (the egress proxy): one EC P-256 CA and one server certificate for every
name the local TLS upstreams answer to. Nothing leaves the run's temp dir; no name is resolved by
DNS (each proxy is told where a name lives: valetkey by its test-only resolver map, mitmproxy and
the sandbox runtime's proxy by a lookup of their own in the harness)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

API_HOST = "api.bench.valetkey.test"  # the credentialed upstream: terminated, secret injected
TUNNEL_HOST = "tunnel.bench.valetkey.test"  # the same upstream as a tunnel destination
BULK_HOST = "bulk.bench.valetkey.test"  # the bulk server, a tunnel destination
NAMES = (API_HOST, TUNNEL_HOST, BULK_HOST)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass(frozen=True)
class TestCA:
    """``ca`` (the CA certificate, what clients and proxies trust), ``ca_key``, and ``cert`` /
    ``key``: the server certificate for every name in ``NAMES``."""

    ca: Path
    ca_key: Path
    cert: Path
    key: Path

    @classmethod
    def create(cls, directory: Path, names: tuple[str, ...] = NAMES) -> TestCA:
        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=2)
        ca = (x509.CertificateBuilder().subject_name(_name("valetkey bench CA"))
              .issuer_name(_name("valetkey bench CA"))
              .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(start).not_valid_after(end)
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                           content_commitment=False, key_encipherment=False,
                                           data_encipherment=False, key_agreement=False, encipher_only=False,
                                           decipher_only=False),
                             critical=True)
              .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
              .sign(ca_key, hashes.SHA256()))
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(_name(names[0])).issuer_name(ca.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(start).not_valid_after(end)
                .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))
        directory.mkdir(parents=True, exist_ok=True)
        found = cls(directory / "ca.pem", directory / "ca.key", directory / "server.pem",
                    directory / "server.key")
        found.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        found.ca_key.write_bytes(_pem_key(ca_key))
        found.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        found.key.write_bytes(_pem_key(key))
        for path in (found.ca_key, found.key):
            path.chmod(0o600)
        return found
