"""Markdown primitives shared by every table in docs/benchmarks.md: numbers, spreads, tables."""

from __future__ import annotations

import statistics


def num(x: float) -> str:
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def spread(values: list[float], unit: str = "") -> str:
    """Median, with (min..max) over the rounds when there is more than one."""
    if not values:
        return "—"
    middle = f"{num(float(statistics.median(values)))}{unit}"
    return middle if len(values) == 1 else f"{middle} ({num(min(values))}..{num(max(values))})"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "---:"
                                                            for i in range(len(header))) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
