"""An npm registry for one tiny package, built at test time (no network).

``NpmRegistry`` plays ``registry.npmjs.org``: ``GET /<name>`` answers the package document (the
"packument": dist-tags and one version whose ``dist`` names the tarball with its sha512 integrity
and sha1 shasum, as the real registry does) and ``GET /<name>/-/<name>-<version>.tgz`` the tarball
(``package/package.json`` and ``package/index.js``). ``npm install`` checks the integrity of what
it downloads, so a tarball the proxy changed would fail the install. Every request is recorded.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass

from tests.support.package_index import Recording

NPM_HOST = "registry.npmjs.org"
NPM_PACKAGE = "valetkey-probe"
NPM_VERSION = "0.1.0"
NPM_GREETING = "required through the valetkey proxy"
TARBALL_PATH = f"/{NPM_PACKAGE}/-/{NPM_PACKAGE}-{NPM_VERSION}.tgz"


def build_tarball() -> bytes:
    """The package as npm publishes it: a gzipped tar of ``package/…``."""
    files = {
        "package/package.json": json.dumps({"name": NPM_PACKAGE, "version": NPM_VERSION, "main": "index.js",
                                            "description": "A package built by the valetkey tests."}).encode(),
        "package/index.js": f"module.exports = {{ greeting: {json.dumps(NPM_GREETING)} }};\n".encode(),
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            archive.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


@dataclass
class NpmRegistry(Recording):
    tarball: bytes = b""

    def __post_init__(self) -> None:
        if not self.tarball:
            self.tarball = build_tarball()

    def packument(self) -> bytes:
        integrity = "sha512-" + base64.b64encode(hashlib.sha512(self.tarball).digest()).decode()
        version = {"name": NPM_PACKAGE, "version": NPM_VERSION, "main": "index.js",
                   "dist": {"tarball": f"https://{NPM_HOST}{TARBALL_PATH}", "integrity": integrity,
                            "shasum": hashlib.sha1(self.tarball).hexdigest()}}  # npm's format
        return json.dumps({"name": NPM_PACKAGE, "dist-tags": {"latest": NPM_VERSION},
                           "versions": {NPM_VERSION: version}}).encode()

    def route(self, path: str) -> tuple[int, str, bytes]:
        if path == f"/{NPM_PACKAGE}":
            return 200, "application/json", self.packument()
        if path == TARBALL_PATH:
            return 200, "application/octet-stream", self.tarball
        return 404, "application/json", b'{"error":"Not found"}'
