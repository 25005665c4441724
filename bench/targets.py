"""The targets of issue 6, judged on this run's figures: met, missed, or not measured."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.proxy import added, med, ratios
from bench.soak import FLAT_MB_PER_MIN
from bench.tables import table

Results = dict[str, Any]


@dataclass(frozen=True)
class Goal:
    what: str
    limit: float
    higher_is_better: bool
    figure: Callable[[Results], float | None]
    unit: str = ""

    def judge(self, results: Results) -> tuple[str, str]:
        try:
            value = self.figure(results)
        except (KeyError, IndexError, TypeError, ZeroDivisionError, StopIteration):
            value = None
        if value is None:
            return "not measured", "—"
        met = value >= self.limit if self.higher_is_better else value <= self.limit
        shown = (f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}" if abs(value) >= 0.01 or not value
                 else f"{value:.4f}")
        return ("met" if met else "**missed**"), f"{shown}{self.unit}"


def _raw(r: Results) -> dict[str, Any]:
    raw: dict[str, Any] = r["proxy"]["raw"]
    return raw


def _median_or_none(values: list[float]) -> float | None:
    return med(values) if values else None


GOALS = [
    Goal("gateway adds ≤ 1 ms p50 over direct (small, moderate rate)", 1.0, False,
           lambda r: _median_or_none(added(_raw(r), "gateway-1", "small", "p50")), " ms"),
    Goal("gateway adds ≤ 1 ms p50 over direct (medium, moderate rate)", 1.0, False,
           lambda r: _median_or_none(added(_raw(r), "gateway-1", "medium", "p50")), " ms"),
    Goal("gateway adds ≤ 5 ms p99 over direct (small, moderate rate)", 5.0, False,
           lambda r: _median_or_none(added(_raw(r), "gateway-1", "small", "p99")), " ms"),
    Goal("gateway adds ≤ 5 ms p99 over direct (medium, moderate rate)", 5.0, False,
           lambda r: _median_or_none(added(_raw(r), "gateway-1", "medium", "p99")), " ms"),
    Goal("one gateway worker ≥ 3x mitmproxy's throughput (small)", 3.0, True,
           lambda r: _median_or_none(ratios(_raw(r), "gateway-1", "mitmproxy", "small")), "x"),
    Goal("one gateway worker ≥ 25 % of nginx's throughput (small)", 0.25, True,
           lambda r: _median_or_none(ratios(_raw(r), "gateway-1", "nginx", "small")), "x"),
    Goal("SSE event forwarded ≤ 1 ms after emission (median, through the gateway)", 1.0, False,
           lambda r: float(r["sse"]["gateway"]["p50"]), " ms"),
    Goal("≥ 7,000 distinct-token verifications/s on one core", 7000, True,
           lambda r: med(r["tokens"]["verify_distinct_per_s"]), "/s"),
    Goal("≥ 200,000 verifications/s of a repeated token on one core", 200_000, True,
           lambda r: med(r["tokens"]["verify_repeated_per_s"]), "/s"),
    Goal("≥ 300 mints/s", 300, True, lambda r: med(r["tokens"]["mint_per_s"]), "/s"),
    Goal("revocation ≤ 10 ms p99 at 8 replicas", 10.0, False,
           lambda r: next(x["p99_ms"] for x in r["revocation"] if x["replicas"] == 8), " ms"),
    Goal("gateway ≤ 80 MB RSS idle (one worker)", 80.0, False,
           lambda r: float(r["memory"]["gateway_1_idle"]), " MB"),
]


def _egress(r: Results) -> dict[str, Any]:
    raw: dict[str, Any] = r["egress"]["raw"]
    return raw


def added_over_direct(raw: dict[str, Any], way: str, kind: str, metric: str) -> list[float]:
    """Per-round latency a way of table 7 adds over direct TLS (ms)."""
    if way not in raw or "direct" not in raw:
        return []
    return [x - y for x, y in zip(raw[way][kind][metric], raw["direct"][kind][metric], strict=True)]


def egress_ratios(raw: dict[str, Any], a: str, b: str, kind: str) -> list[float]:
    if a not in raw or b not in raw:
        return []
    return [x / y for x, y in zip(raw[a][kind]["rps"], raw[b][kind]["rps"], strict=True) if y]


def _gateway_unchanged(r: Results) -> float | None:
    """Table 1's gateway p50 added over direct (small) now, minus the previous run's (ms)."""
    before = r.get("gateway_before", {}).get("p50_added_small")
    now = _median_or_none(added(_raw(r), "gateway-1", "small", "p50"))
    return None if before is None or now is None else now - float(before)


FREE_MS = 0.01  # a cached leaf is "free": a dictionary hit, under 10 µs

def _terminate_added(kind: str) -> Callable[[Results], float | None]:
    return lambda r: _median_or_none(added_over_direct(_egress(r), "valetkey-terminate", kind, "p50"))


def _terminate_over_mitmproxy(r: Results) -> float | None:
    return _median_or_none(egress_ratios(_egress(r), "valetkey-terminate", "mitmproxy-terminate", "small"))


EGRESS_GOALS = [
    Goal("terminate mode adds ≤ 2 ms p50 over direct TLS (small, keep-alive)", 2.0, False,
         _terminate_added("small"), " ms"),
    Goal("terminate mode adds ≤ 2 ms p50 over direct TLS (medium, keep-alive)", 2.0, False,
         _terminate_added("medium"), " ms"),
    Goal("terminate mode ≥ 3x mitmproxy's throughput (small)", 3.0, True, _terminate_over_mitmproxy, "x"),
    Goal("tunnel mode ≥ 1 GB/s bulk, TLS end to end (wall clock; the direct row is this machine's "
         "ceiling)", 1000.0, True,
         lambda r: _median_or_none(r["egress"]["bulk"]["valetkey-tunnel"]["mb_per_s"]), " MB/s"),
    Goal("tunnel mode ≥ 1 GB/s bulk, raw ends (wall clock: the relay's own speed)", 1000.0, True,
         lambda r: _median_or_none(r["egress"]["bulk"]["valetkey-tunnel"].get("raw_mb_per_s", [])), " MB/s"),
    Goal("tunnel mode ≥ 1 GB/s bulk per proxy CPU-second", 1000.0, True,
         lambda r: _median_or_none(r["egress"]["bulk"]["valetkey-tunnel"]["mb_per_cpu_s"]), " MB/s"),
    Goal("a new leaf certificate ≤ 5 ms (median)", 5.0, False,
         lambda r: float(r["egress"]["mint"]["fresh_ms"]), " ms"),
    Goal("a cached leaf certificate is free (≤ 0.01 ms)", FREE_MS, False,
         lambda r: float(r["egress"]["mint"]["cached_ms"]), " ms"),
    Goal("gateway mode unchanged: table 1's gateway p50 added over direct (small) within 0.5 ms of the "
         "previous run", 0.5, False, _gateway_unchanged, " ms"),
]


def redaction_mb_per_s(results: Results) -> float | None:
    """The 100 MB median from ``bench/redact.py``'s output, when this run has it."""
    output = results.get("redaction", {}).get("output", "")
    match = re.search(r"100 MB[^\n]*?median\s+([\d.]+)\s*MB/s", output)
    return float(match.group(1)) if match else None


def judged(results: Results) -> list[tuple[str, str, str]]:
    return [(t.what, *t.judge(results)) for t in GOALS]


def missed(results: Results) -> list[str]:
    return [what for what, verdict, _ in judged(results) if verdict.endswith("missed**")]


def targets(results: Results) -> str:

    rows = [[what, verdict, figure] for what, verdict, figure in judged(results)]
    mbps = redaction_mb_per_s(results)
    if mbps is None:
        rows.append(["redaction ≥ 500 MB/s per core (100 MB body)", "see [Redaction](#redaction)", "—"])
    else:
        rows.append(["redaction ≥ 500 MB/s per core (100 MB body)", "met" if mbps >= 500 else "**missed**",
                     f"{mbps:,.0f} MB/s"])
    soak = results.get("soak")
    if soak:
        slope = float(soak["gateway"]["slope_second_half"])
        rows.append([f"gateway RSS flat under the {soak['minutes']:g}-minute soak ([Soak](#soak))",
                     "met" if abs(slope) <= FLAT_MB_PER_MIN else "**missed**",
                     f"{slope:+.3f} MB/min, "
                     f"{soak['gateway']['first']:.1f} → {soak['gateway']['last']:.1f} MB"])
    else:
        rows.append(["gateway RSS flat under the 10-minute soak", "see [Soak](#soak)", "—"])
    return "\n\n".join(["## Targets (issue 6)", table(["target", "verdict", "figure"], rows)])
