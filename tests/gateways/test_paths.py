"""Canonical request paths: one final empty segment is a trailing slash; anything else empty is refused."""

from __future__ import annotations

import pytest

from contract.errors import ValetkeyError
from gateways.paths import canonical_path


@pytest.mark.parametrize(
    ("raw", "segments", "forwarded"),
    [
        pytest.param(b"/", (), "/", id="root"),
        pytest.param(b"/a/b", ("a", "b"), "/a/b", id="plain"),
        pytest.param(b"/simple/requests/", ("simple", "requests", ""), "/simple/requests/", id="trailing-slash"),
        pytest.param(b"/a%20b/", ("a b", ""), "/a%20b/", id="escaped-then-slash"),
    ],
)
def test_canonical(raw: bytes, segments: tuple[str, ...], forwarded: str) -> None:
    path = canonical_path(raw)

    assert (path.segments, path.raw) == (segments, forwarded)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"//", id="two-slashes"),
        pytest.param(b"/a//b", id="empty-middle"),
        pytest.param(b"/a//", id="two-trailing"),
        pytest.param(b"/a/./", id="dot-then-slash"),
        pytest.param(b"/a/%2e%2e/", id="encoded-dotdot-then-slash"),
        pytest.param(b"/a/%2F/", id="encoded-slash"),
    ],
)
def test_refused(raw: bytes) -> None:
    with pytest.raises(ValetkeyError) as info:
        canonical_path(raw)

    assert info.value.code == "purpose_not_granted"
