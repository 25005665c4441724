"""Durations, sizes and rates as written in policy files."""

from __future__ import annotations

import re

import pytest

from policies.units import parse_duration, parse_rate, parse_size


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        pytest.param(900, 900, id="int"),
        pytest.param("900", 900, id="digits"),
        pytest.param("90s", 90, id="seconds"),
        pytest.param("15m", 900, id="minutes"),
        pytest.param("1h", 3600, id="hours"),
        pytest.param("2d", 172800, id="days"),
        pytest.param(" 30 m ", 1800, id="spaces"),
    ],
)
def test_duration(value: object, seconds: int) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param(0, "must be positive", id="zero"),
        pytest.param("0m", "must be positive", id="zero-minutes"),
        pytest.param(-5, "must be positive", id="negative-int"),
        pytest.param("-5m", "expected a duration", id="negative-string"),
        pytest.param("soon", "expected a duration", id="word"),
        pytest.param("", "expected a duration", id="empty"),
        pytest.param("m", "expected a duration", id="unit-only"),
        pytest.param("1.5h", "expected a duration", id="fraction"),
        pytest.param(1.5, "expected a duration", id="float"),
        pytest.param("15 min", "expected a duration", id="long-unit"),
        pytest.param("15M", "expected a duration", id="upper-case-unit"),
        pytest.param("1h30m", "expected a duration", id="compound"),
        pytest.param("\u0661\u0665m", "expected a duration", id="arabic-indic-digits"),
        pytest.param(None, "expected a duration", id="none"),
        pytest.param(True, "boolean", id="bool"),
    ],
)
def test_bad_duration(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_duration(value)


@pytest.mark.parametrize(
    ("value", "size"),
    [
        pytest.param(65536, 65536, id="int"),
        pytest.param("512", 512, id="digits"),
        pytest.param("10B", 10, id="bytes"),
        pytest.param("64KiB", 65536, id="kib"),
        pytest.param("1MiB", 1048576, id="mib"),
        pytest.param("2GiB", 2 * 1024**3, id="gib"),
        pytest.param("64KB", 64000, id="kb"),
        pytest.param("4MB", 4000000, id="mb"),
        pytest.param("1GB", 10**9, id="gb"),
        pytest.param(" 4 MiB ", 4 * 1024**2, id="spaces"),
    ],
)
def test_size(value: object, size: int) -> None:
    assert parse_size(value) == size


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param(0, "must be positive", id="zero"),
        pytest.param("0KiB", "must be positive", id="zero-kib"),
        pytest.param(-1, "must be positive", id="negative-int"),
        pytest.param("-1KiB", "expected a size", id="negative-string"),
        pytest.param("huge", "expected a size", id="word"),
        pytest.param("1.5MiB", "expected a size", id="fraction"),
        pytest.param("64kib", "expected a size", id="lower-case-unit"),
        pytest.param("64 KiBs", "expected a size", id="plural-unit"),
        pytest.param("1TiB", "expected a size", id="unknown-unit"),
        pytest.param("\u0664KiB", "expected a size", id="arabic-indic-digit"),
        pytest.param("", "expected a size", id="empty"),
        pytest.param(True, "boolean", id="bool"),
    ],
)
def test_bad_size(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_size(value)


@pytest.mark.parametrize(
    ("value", "rate"),
    [
        pytest.param("3 per 10m", (3, 600), id="per-ten-minutes"),
        pytest.param("60 per 1m", (60, 60), id="per-minute"),
        pytest.param("5 per s", (5, 1), id="implicit-one"),
        pytest.param("20 per 1h", (20, 3600), id="per-hour"),
        pytest.param("100 per 1d", (100, 86400), id="per-day"),
        pytest.param("  3  per  10 m ", (3, 600), id="spaces"),
    ],
)
def test_rate(value: object, rate: tuple[int, int]) -> None:
    assert parse_rate(value) == rate


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("0 per 1m", "must be positive", id="zero-count"),
        pytest.param("3 per 0m", "must be positive", id="zero-period"),
        pytest.param("lots", "expected a rate", id="word"),
        pytest.param("3/10m", "expected a rate", id="slash"),
        pytest.param("3 per 10", "expected a rate", id="no-unit"),
        pytest.param("3per10m", "expected a rate", id="no-spaces"),
        pytest.param("-3 per 10m", "expected a rate", id="negative"),
        pytest.param("3 per 10 minutes", "expected a rate", id="long-unit"),
        pytest.param("3 every 10m", "expected a rate", id="every"),
        pytest.param("\u0663 per 1m", "expected a rate", id="arabic-indic-digit"),
        pytest.param(3, "expected a rate", id="int"),
        pytest.param(None, "expected a rate", id="none"),
    ],
)
def test_bad_rate(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_rate(value)
