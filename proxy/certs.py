"""Leaf certificates for terminated tunnels, minted here from the deployment CA and cached.

    LeafCerts(load_ca)        ``load_ca`` returns (CA certificate, CA key) PEMs, from Vault
    await leaves.start()      read the CA (a proxy that cannot read it does not start)
    leaves.context(host)      an ``ssl.SSLContext`` serving a certificate for ``host``: minted on
                              first use (~1 ms, EC P-256), then cached until the CA rotates

One leaf key pair per process signs nothing and is never written anywhere but a private temporary
file that ``ssl`` reads back at once (the ``ssl`` module only loads chains from files). The CA is
re-read every ``refresh`` seconds in the background; a rotation empties the cache, so new
handshakes get leaves of the new CA (the bundle carries both CA certificates during a rotation).
A context offers ALPN ``http/1.1`` only; the ClientHello's server name was checked before the
handshake starts (``proxy.tunnel.hello``).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import ssl
import tempfile
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from contract.errors import Reason, Unavailable, ValetkeyError
from contract.tasks import stop_task

log = logging.getLogger("valetkey.proxy")
CaLoader = Callable[[], Awaitable[tuple[bytes, bytes]]]
LEAF_DAYS = 7
MAX_LEAVES = 4096  # hosts with a cached context; the least recently used goes first


class LeafCerts:
    def __init__(self, load_ca: CaLoader, *, refresh: float = 300.0) -> None:
        self._load_ca = load_ca
        self._refresh = refresh
        self._ca_cert: x509.Certificate | None = None
        self._ca_key: ec.EllipticCurvePrivateKey | None = None
        self._ca_pem = b""
        self._key = ec.generate_private_key(ec.SECP256R1())
        # the traditional EC form: OpenSSL 3 decodes it faster than PKCS8 on every new leaf
        self._key_pem = self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption())
        self._cache: OrderedDict[str, ssl.SSLContext] = OrderedDict()
        # in memory where there is a tmpfs: the chain file holds the leaf key for a moment
        shm = "/dev/shm"  # noqa: S108 - a private 0700 directory made by mkdtemp
        self._dir = tempfile.mkdtemp(prefix="valetkey-leaves-", dir=shm if os.path.isdir(shm) else None)
        self._task: asyncio.Task[None] | None = None
        self.minted = 0

    def __repr__(self) -> str:
        return f"LeafCerts(cached={len(self._cache)}, minted={self.minted})"

    async def load(self) -> None:
        try:
            cert_pem, key_pem = await self._load_ca()
            cert = x509.load_pem_x509_certificate(cert_pem)
            key = serialization.load_pem_private_key(key_pem, password=None)
        except ValetkeyError:
            raise
        except Exception as exc:  # a malformed CA in Vault: say what, never the key
            raise Unavailable(f"the deployment CA could not be read ({type(exc).__name__})",
                              Reason.PROXY_CA_UNAVAILABLE) from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise Unavailable("the deployment CA key is not an EC key", Reason.PROXY_CA_UNAVAILABLE)
        if self._ca_cert is not None and cert.fingerprint(hashes.SHA256()) != self._ca_cert.fingerprint(
                hashes.SHA256()):
            log.info('{"event": "proxy_ca_rotated"}')
            self._cache.clear()
        self._ca_cert, self._ca_key = cert, key
        self._ca_pem = cert.public_bytes(serialization.Encoding.PEM)

    async def start(self) -> None:
        await self.load()
        self._task = asyncio.create_task(self._run(), name="proxy-ca-refresh")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None
        for name in os.listdir(self._dir):
            os.unlink(os.path.join(self._dir, name))
        os.rmdir(self._dir)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._refresh)
            try:
                await self.load()
            except ValetkeyError as exc:  # keep serving with the CA we have
                log.warning('{"event": "proxy_ca_refresh_failed", "reason": "%s"}', exc.code)

    def context(self, host: str) -> ssl.SSLContext:
        context = self._cache.get(host)
        if context is not None:
            self._cache.move_to_end(host)
            return context
        context = self._new_context(host)
        self._cache[host] = context
        if len(self._cache) > MAX_LEAVES:
            self._cache.popitem(last=False)
        return context

    @property
    def loaded(self) -> bool:
        return self._ca_cert is not None

    def cached(self, host: str) -> bool:
        return host in self._cache

    def mint(self, host: str) -> bytes:
        """A PEM certificate for ``host`` signed by the CA, followed by the CA certificate."""
        if self._ca_cert is None or self._ca_key is None:
            raise Unavailable("no deployment CA loaded", Reason.PROXY_CA_UNAVAILABLE)
        now = datetime.datetime.now(datetime.UTC)
        not_after = min(now + datetime.timedelta(days=LEAF_DAYS), self._ca_cert.not_valid_after_utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self._ca_cert.subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()),
                           critical=False)
            .sign(self._ca_key, hashes.SHA256())
        )
        self.minted += 1
        return cert.public_bytes(serialization.Encoding.PEM) + self._ca_pem

    def _new_context(self, host: str) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        chain = os.path.join(self._dir, f"leaf-{os.getpid()}-{self.minted}.pem")
        fd = os.open(chain, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, self.mint(host) + self._key_pem)
        finally:
            os.close(fd)
        try:
            context.load_cert_chain(chain)
        finally:
            os.unlink(chain)
        return context
