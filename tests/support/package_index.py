"""A PEP 503 simple index and its file host, serving one tiny wheel built at test time (no network).

``SimpleIndex`` plays ``pypi.org`` (``/simple/`` and ``/simple/<project>/``) and links the wheel at
``https://files.pythonhosted.org/packages/…``, where ``FileHost`` serves it: as on the real index,
pip reads the page from one host and downloads from the other. Both record every request.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROJECT = "valetkey-probe"
MODULE = "valetkey_probe"
VERSION = "0.1.0"
WHEEL = f"{MODULE}-{VERSION}-py3-none-any.whl"
FILES_HOST = "files.pythonhosted.org"
WHEEL_PATH = f"/packages/9f/3c/{WHEEL}"
GREETING = "installed through the valetkey proxy"

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(directory: Path) -> Path:
    """``valetkey_probe-0.1.0-py3-none-any.whl``: one module, metadata and a RECORD with hashes."""
    info = f"{MODULE}-{VERSION}.dist-info"
    files = {
        f"{MODULE}/__init__.py": f'GREETING = "{GREETING}"\n'.encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {PROJECT}\nVersion: {VERSION}\n"
                            "Summary: A wheel built by the valetkey tests.\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: valetkey-tests\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = "".join(_record_line(name, data) + "\n" for name, data in files.items()) + f"{info}/RECORD,,\n"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / WHEEL
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{info}/RECORD", record)
    return path


@dataclass(frozen=True)
class Hit:
    method: str
    path: str
    headers: tuple[tuple[str, str], ...]


@dataclass
class Recording:
    """Base ASGI app: record each request, then answer ``route(path)`` (status, type, body)."""

    seen: list[Hit] = field(default_factory=list)

    def route(self, path: str) -> tuple[int, str, bytes]:
        raise NotImplementedError

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self.seen.append(Hit(scope["method"], scope["path"], tuple(
            (k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"])))
        status, content_type, body = self.route(scope["path"])
        if scope["method"] == "HEAD":
            body = b""
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", content_type.encode())]})
        await send({"type": "http.response.body", "body": body})


@dataclass
class SimpleIndex(Recording):
    wheel: Path = Path()

    def route(self, path: str) -> tuple[int, str, bytes]:
        if path == "/simple/":
            return 200, "text/html", f'<html><body><a href="/simple/{PROJECT}/">{PROJECT}</a></body></html>'.encode()
        if path == f"/simple/{PROJECT}/":
            digest = hashlib.sha256(self.wheel.read_bytes()).hexdigest()
            link = f"https://{FILES_HOST}{WHEEL_PATH}#sha256={digest}"
            return 200, "text/html", (f"<!DOCTYPE html><html><body><h1>Links for {PROJECT}</h1>"
                                      f'<a href="{link}">{WHEEL}</a></body></html>').encode()
        return 404, "text/plain", b"not found\n"


@dataclass
class FileHost(Recording):
    wheel: Path = Path()

    def route(self, path: str) -> tuple[int, str, bytes]:
        if path == WHEEL_PATH:
            return 200, "application/octet-stream", self.wheel.read_bytes()
        return 404, "text/plain", b"not found\n"
