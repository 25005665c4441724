"""Parsers for the human units used in policy: durations, sizes and rates."""

from __future__ import annotations

import re

# re.ASCII: without it \d also accepts other scripts' digits (Arabic-Indic '15m' would parse).
_DURATION = re.compile(r"^\s*(\d+)\s*(s|m|h|d)?\s*$", re.ASCII)
_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*$", re.ASCII)
_RATE = re.compile(r"^\s*(\d+)\s+per\s+(\d*)\s*(s|m|h|d)\s*$", re.ASCII)
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}
_BYTES = {
    None: 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3,
    "KB": 1000, "MB": 1000**2, "GB": 1000**3,
}


def parse_duration(value: object) -> int:
    """``900``, ``"90s"``, ``"15m"``, ``"1h"``, ``"1d"`` → seconds (> 0)."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 15m, got a boolean")
    if isinstance(value, int):
        seconds = value
    else:
        match = _DURATION.fullmatch(str(value))
        if not match:
            raise ValueError(f"expected a duration such as 90s, 15m or 1h, got {value!r}")
        seconds = int(match.group(1)) * _SECONDS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {value!r}")
    return seconds


def parse_size(value: object) -> int:
    """``65536``, ``"64KiB"``, ``"1MiB"`` → bytes (> 0)."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 64KiB, got a boolean")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.fullmatch(str(value))
        if not match:
            raise ValueError(f"expected a size such as 64KiB or 1MiB, got {value!r}")
        size = int(match.group(1)) * _BYTES[match.group(2)]
    if size <= 0:
        raise ValueError(f"size must be positive, got {value!r}")
    return size


def parse_rate(value: object) -> tuple[int, int]:
    """``"3 per 10m"``, ``"60 per 1m"``, ``"5 per s"`` → (count, period seconds)."""
    match = _RATE.fullmatch(str(value))
    if not match:
        raise ValueError(f"expected a rate such as '3 per 10m', got {value!r}")
    count = int(match.group(1))
    period = int(match.group(2) or 1) * _SECONDS[match.group(3)]
    if count <= 0 or period <= 0:
        raise ValueError(f"rate must be positive, got {value!r}")
    return count, period
