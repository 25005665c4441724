"""gateways/encodings.py: every coding, stacked, in any chunking; what does not decode is refused
with its reason code; the bomb guard stops a tiny body that inflates without bound."""

from __future__ import annotations

import gzip
import zlib

import brotli  # type: ignore[import-untyped]
import pytest
import zstandard

from contract.errors import UpstreamError
from gateways.encodings import FLOOR, body_decoder, codings
from tests.support.leaks import encode, filler, header_coding

BODY = filler(300_000, seed=7) + bytes(range(256)) * 40


def decode(header: bytes, blob: bytes, chunk: int) -> bytes:
    decoder = body_decoder([header])
    out = [piece for i in range(0, len(blob), chunk) for piece in decoder.feed(blob[i:i + chunk])]
    return b"".join(out) + b"".join(decoder.finish())


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
@pytest.mark.parametrize("applied", ["gzip", "deflate", "deflate-raw", "br", "zstd", "gzip, br",
                                     "br, zstd, deflate", "zstd, gzip"])
def test_round_trip(applied: str, chunk: int) -> None:
    body = BODY if chunk > 1 else BODY[:5000]
    assert decode(header_coding(applied), encode(body, applied), chunk) == body


def test_concatenated_members_and_frames() -> None:
    assert decode(b"gzip", gzip.compress(b"one ") + gzip.compress(b"two"), 3) == b"one two"
    z = zstandard.ZstdCompressor()
    assert decode(b"zstd", z.compress(b"one ") + z.compress(b"two"), 5) == b"one two"


@pytest.mark.parametrize("header", [b"gzip", b"deflate", b"br", b"zstd", b"gzip, br"])
def test_empty_body_is_fine(header: bytes) -> None:
    assert decode(header, b"", 1) == b""


@pytest.mark.parametrize(("values", "expected"), [
    pytest.param([b"identity"], [], id="identity"),
    pytest.param([b"GZIP"], ["gzip"], id="case"),
    pytest.param([b"x-gzip, br"], ["gzip", "br"], id="alias-stacked"),
    pytest.param([b"gzip", b"zstd"], ["gzip", "zstd"], id="repeated-header"),
])
def test_codings(values: list[bytes], expected: list[str]) -> None:
    assert codings(values) == expected


BROKEN = [
    pytest.param(b"compress", b"x", id="unknown-coding"),
    pytest.param(b"gzip, aes128gcm", b"x", id="unknown-stacked"),
    pytest.param(b"gzip", b"not gzip at all", id="gzip-garbage"),
    pytest.param(b"gzip", gzip.compress(BODY)[:-30], id="gzip-truncated"),
    pytest.param(b"gzip", gzip.compress(b"a") + b"trailing", id="gzip-trailing-garbage"),
    pytest.param(b"deflate", zlib.compress(BODY)[:-10], id="deflate-truncated"),
    pytest.param(b"br", b"\xff\xff\xff\xff", id="br-garbage"),
    pytest.param(b"br", brotli.compress(BODY)[:-10], id="br-truncated"),
    pytest.param(b"zstd", b"not zstd", id="zstd-garbage"),
    pytest.param(b"zstd", zstandard.ZstdCompressor().compress(BODY)[:-10], id="zstd-truncated"),
]


@pytest.mark.parametrize(("header", "blob"), BROKEN)
def test_undecodable(header: bytes, blob: bytes) -> None:
    with pytest.raises(UpstreamError) as caught:
        decode(header, blob, 1000)
    assert (caught.value.code, caught.value.status) == ("undecodable_response", 502)


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_bomb_is_stopped_past_the_floor(coding: str) -> None:
    blob = encode(bytes(FLOOR + 8 * 1024 * 1024), coding)
    decoder = body_decoder([coding.encode()])
    pieces: list[int] = []

    def feed_all() -> None:
        for i in range(0, len(blob), 65536):
            pieces.extend(len(piece) for piece in decoder.feed(blob[i:i + 65536]))

    with pytest.raises(UpstreamError) as caught:
        feed_all()
    assert caught.value.code == "decompression_bomb"
    assert max(pieces) <= 8 * 1024 * 1024  # bounded per step, never the whole at once
    decoded = sum(pieces)
    assert FLOOR - 8 * 1024 * 1024 <= decoded <= FLOOR  # the piece crossing the floor is not yielded
