"""Upstream base URLs: which become origins, and which are refused with which message."""

from __future__ import annotations

import pytest

from policies.origins import FIX, Origin, OriginError, parse_origin


@pytest.mark.parametrize(
    ("raw", "origin", "url"),
    [
        pytest.param("https://api.example.com", Origin("https", "api.example.com", 443),
                     "https://api.example.com", id="https"),
        pytest.param("HTTPS://API.Example.COM/", Origin("https", "api.example.com", 443),
                     "https://api.example.com", id="case-and-slash"),
        pytest.param("http://localhost:8080", Origin("http", "localhost", 8080),
                     "http://localhost:8080", id="port"),
        pytest.param("https://api.example.com:443", Origin("https", "api.example.com", 443),
                     "https://api.example.com", id="default-port"),
        pytest.param("http://10.0.0.7", Origin("http", "10.0.0.7", 80), "http://10.0.0.7",
                     id="ipv4"),
        pytest.param("https://[2001:db8::1]:8443", Origin("https", "2001:db8::1", 8443),
                     "https://[2001:db8::1]:8443", id="ipv6"),
    ],
)
def test_parse_origin(raw: str, origin: Origin, url: str) -> None:
    parsed = parse_origin(raw)

    assert parsed == origin
    assert parsed.url == url


@pytest.mark.parametrize(
    ("raw", "message", "fix"),
    [
        pytest.param("ftp://files.example.com", "scheme 'ftp'", FIX, id="ftp"),
        pytest.param("file:///etc/passwd", "scheme 'file'", FIX, id="file"),
        pytest.param("api.example.com", "scheme ''", FIX, id="no-scheme"),
        pytest.param("https://u:p@api.example.com", "userinfo", "secrets come from Vault",
                     id="userinfo"),
        pytest.param("https://@api.example.com", "userinfo", "secrets come from Vault",
                     id="empty-userinfo"),
        pytest.param("https://api.example.com#", "fragment", FIX, id="empty-fragment"),
        pytest.param("https://api.example.com?", "query", FIX, id="empty-query"),
        pytest.param("https://api.example.com/v1", "path '/v1'", FIX, id="path"),
        pytest.param("https://api.example.com//", "path '//'", FIX, id="double-slash"),
        pytest.param("https://api.example.com:99999", "is not a URL", FIX, id="port-range"),
        pytest.param("https://api.example.com:https", "is not a URL", FIX, id="port-word"),
        pytest.param("https://api.example.com:0", "port 0", FIX, id="port-zero"),
        pytest.param("https://", "exactly one host", FIX, id="no-host"),
        pytest.param("https://*.example.com", "exactly one host", FIX, id="wildcard"),
        pytest.param("https://a.com\\.b.com", "exactly one host", FIX, id="backslash"),
        pytest.param("https://a b.com", "exactly one host", FIX, id="space"),
        pytest.param("https://api.example.com.", "exactly one host", FIX, id="trailing-dot"),
        pytest.param("https://api-.example.com", "exactly one host", FIX, id="label-ends-dash"),
        pytest.param("https://" + "a" * 64 + ".com", "exactly one host", FIX, id="label-too-long"),
        pytest.param("http://2130706433", "exactly one host", FIX, id="decimal-ipv4"),
        pytest.param("http://0x7f000001", "exactly one host", FIX, id="hex-ipv4"),
        pytest.param("http://127.1", "exactly one host", FIX, id="short-ipv4"),
        pytest.param("http://b\u00fccher.example", "exactly one host", FIX, id="unicode-host"),
    ],
)
def test_parse_origin_refuses(raw: str, message: str, fix: str) -> None:
    with pytest.raises(OriginError) as info:
        parse_origin(raw)

    assert message in info.value.message
    assert fix in info.value.fix
