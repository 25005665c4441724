"""Undoing a Content-Encoding the upstream applied although the gateway asked for ``identity``.

Redaction must see the bytes the sandbox will read, so a compressed body is decoded as a stream
(gzip, deflate with or without its zlib wrapper, br, zstd, stacked in any order), redacted, and sent
uncompressed without Content-Encoding. A coding we cannot undo, or a stream that does not decode,
is never passed through unscanned: ``undecodable_response``.

Decompression-bomb guard: each decode step produces at most ``PIECE`` bytes at a time, and the
decoded total may not pass ``MAX_RATIO`` times the bytes received once it is over ``FLOOR``
(``decompression_bomb``). Both errors are 502 ``UpstreamError``s; messages name no content.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from typing import Protocol

import brotli  # type: ignore[import-untyped]
import zstandard

from contract.errors import Reason, UpstreamError

PIECE = 256 * 1024  # most bytes one decode call returns
FLOOR = 64 * 1024 * 1024  # decoded bytes always accepted, whatever the ratio
MAX_RATIO = 200  # past FLOOR: decoded bytes per received byte (legitimate JSON stays far below)
ZSTD_SLICE = 256  # zstd has no output bound per call: feed it slices (≤ ~8 MiB out each)
ALIASES = {"gzip": "gzip", "x-gzip": "gzip", "deflate": "deflate", "br": "br", "zstd": "zstd"}


def undecodable(detail: str) -> UpstreamError:
    return UpstreamError(f"the upstream response could not be decoded: {detail}",
                         Reason.UNDECODABLE_RESPONSE)


def codings(values: Iterable[bytes]) -> list[str]:
    """Content-Encoding values (possibly repeated) → codings in the order they were applied."""
    out = []
    for value in values:
        for part in value.decode("latin-1").split(","):
            name = part.strip().lower()
            if name and name != "identity":
                if name not in ALIASES:
                    raise undecodable(f"unsupported content-coding {name[:32]!r}")
                out.append(ALIASES[name])
    return out


class _Step(Protocol):
    def feed(self, data: bytes) -> Iterator[bytes]: ...
    def finish(self) -> Iterator[bytes]: ...


class _Zlib:
    """gzip (members one after another) or deflate (zlib-wrapped, or raw as some servers send)."""

    def __init__(self, gzip: bool) -> None:
        self._gzip = gzip
        self._d: zlib._Decompress | None = zlib.decompressobj(31) if gzip else None
        self._head = b""  # deflate: the first two bytes tell zlib from raw
        self._fed = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        self._fed = self._fed or bool(data)
        if self._d is None:
            self._head += data
            if len(self._head) < 2:
                return
            data, self._head = self._head, b""
            wrapped = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            self._d = zlib.decompressobj(15 if wrapped else -15)
        try:
            while data:
                if self._d.eof:
                    data = self._next_member(data)
                    continue
                out = self._d.decompress(data, PIECE)
                data = self._d.unconsumed_tail
                while len(out) == PIECE and not data:  # more may be pending inside zlib
                    yield out
                    out = self._d.decompress(b"", PIECE)
                    data = self._d.unconsumed_tail
                if out:
                    yield out
                if self._d.eof:
                    data = self._d.unused_data + data
        except zlib.error:
            raise undecodable("corrupt gzip/deflate stream") from None

    def _next_member(self, data: bytes) -> bytes:
        if not data.strip(b"\0"):
            return b""  # zero padding after the last member
        if not self._gzip or not data.startswith(b"\x1f\x8b"):
            raise undecodable("data after the end of the compressed stream")
        self._d = zlib.decompressobj(31)
        return data

    def finish(self) -> Iterator[bytes]:
        if self._head or (self._fed and self._d is not None and not self._d.eof):
            raise undecodable("truncated gzip/deflate stream")
        return iter(())


class _Brotli:
    def __init__(self) -> None:
        self._d = brotli.Decompressor()
        self._fed = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        self._fed = True
        try:
            out = self._d.process(data, output_buffer_limit=PIECE)
            if out:
                yield out
            # a full buffer means more may be pending even when it says it can accept more input
            while not self._d.can_accept_more_data() or len(out) >= PIECE:
                out = self._d.process(b"", output_buffer_limit=PIECE)
                if not out:
                    break
                yield out
        except brotli.error:
            raise undecodable("corrupt brotli stream") from None

    def finish(self) -> Iterator[bytes]:
        if self._fed and not self._d.is_finished():
            raise undecodable("truncated brotli stream")
        return iter(())


class _Zstd:
    """Frames one after another; ``eof`` is reliable only frame by frame, so one decoder each."""

    def __init__(self) -> None:
        self._d = zstandard.ZstdDecompressor().decompressobj()
        self._fed = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        self._fed = self._fed or bool(data)
        try:
            for i in range(0, len(data), ZSTD_SLICE):
                piece = data[i:i + ZSTD_SLICE]
                while piece:
                    if self._d.eof:
                        self._d = zstandard.ZstdDecompressor().decompressobj()
                    out = self._d.decompress(piece)
                    piece = self._d.unused_data if self._d.eof else b""
                    if out:
                        yield out
        except zstandard.ZstdError:
            raise undecodable("corrupt zstd stream") from None

    def finish(self) -> Iterator[bytes]:
        if self._fed and not self._d.eof:
            raise undecodable("truncated zstd stream")
        return iter(())


def _step(coding: str) -> _Step:
    if coding == "br":
        return _Brotli()
    if coding == "zstd":
        return _Zstd()
    return _Zlib(gzip=coding == "gzip")


class BodyDecoder:
    """The codings undone last-applied first; ``feed`` and ``finish`` yield decoded pieces."""

    def __init__(self, applied: list[str]) -> None:
        self.codings = applied
        self._steps = [_step(c) for c in reversed(applied)]
        self.received = 0
        self.decoded = 0

    def __bool__(self) -> bool:
        return bool(self._steps)

    def feed(self, data: bytes) -> Iterator[bytes]:
        self.received += len(data)
        yield from self._guarded(self._through(1, self._steps[0].feed(data)))

    def finish(self) -> Iterator[bytes]:
        for i, step in enumerate(self._steps):
            yield from self._guarded(self._through(i + 1, step.finish()))

    def _through(self, first: int, pieces: Iterator[bytes]) -> Iterator[bytes]:
        for step in self._steps[first:]:
            pieces = _fed(step, pieces)
        return pieces

    def _guarded(self, pieces: Iterator[bytes]) -> Iterator[bytes]:
        for piece in pieces:
            self.decoded += len(piece)
            if self.decoded > max(FLOOR, MAX_RATIO * self.received):
                raise UpstreamError(
                    f"the decoded response passed {MAX_RATIO}x the {self.received} bytes received",
                    Reason.DECOMPRESSION_BOMB)
            yield piece


def _fed(step: _Step, pieces: Iterator[bytes]) -> Iterator[bytes]:
    for piece in pieces:
        yield from step.feed(piece)


def body_decoder(content_encoding: Iterable[bytes]) -> BodyDecoder:
    """A decoder for the response's Content-Encoding values; empty (falsy) for identity."""
    return BodyDecoder(codings(content_encoding))
