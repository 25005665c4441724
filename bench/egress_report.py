"""Markdown for table 7 of docs/benchmarks.md (the egress proxy, ``bench/egress.py``), with the
targets of issue 15 judged on this run's figures (``bench/targets.py``: ``EGRESS_GOALS``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from bench.proxy import KINDS
from bench.tables import num, spread, table
from bench.targets import EGRESS_GOALS, Goal, added_over_direct, egress_ratios

Results = dict[str, Any]

# the rows of table 1 that "gateway-mode figures unchanged" compares, as docs/benchmarks.md spells them
BEFORE_ROWS = {
    "p50_added_small": r"\| valetkey gateway, 1 worker: p50 added over direct \| ([-\d.]+) ms",
    "vs_mitmproxy_small": r"\| gateway \(1 worker\) / mitmproxy, throughput \| ([\d.]+)x",
}


def gateway_before(doc: Path) -> dict[str, Any]:
    """Table 1's gateway figures as the committed docs/benchmarks.md has them (before this run)."""
    try:
        text = doc.read_text()
    except OSError:
        return {}
    found: dict[str, Any] = {}
    for key, pattern in BEFORE_ROWS.items():
        match = re.search(pattern, text)
        if match:
            found[key] = float(match.group(1))
    date = re.search(r"- \*\*Date\*\*: ([^;]+);", text)
    if found and date:
        found["date"] = date.group(1)
    return found


def _targets(results: Results) -> str:
    rows = [[g.what, *g.judge(results)] for g in EGRESS_GOALS]
    return table(["target (issue 15)", "verdict", "figure"], rows)


def _requests(e: dict[str, Any]) -> str:
    raw, labels, plan = e["raw"], e["labels"], e["plan"]
    rows = []
    for name, label in labels.items():
        cells = [label]
        for kind in KINDS:
            c = raw[name][kind]
            cells += [spread(c["rps"]), spread(c["p50"]), spread(c["p99"]), spread(c["cpu_ms"])]
        rows.append(cells)
    header = ["way"] + [f"{k} {m}" for k in KINDS for m in ("req/s", "p50 ms", "p99 ms", "CPU ms/req")]
    comparisons = []
    for name, label in labels.items():
        if name == "direct":
            continue
        comparisons.append([f"{label}: p50 added over direct TLS",
                            *(spread(added_over_direct(raw, name, k, "p50"), " ms") for k in KINDS)])
    for a, b in (("valetkey-terminate", "mitmproxy-terminate"), ("valetkey-terminate", "srt-terminate"),
                 ("valetkey-tunnel", "mitmproxy-tunnel"), ("valetkey-tunnel", "srt-tunnel")):
        if a in raw and b in raw:
            comparisons.append([f"{labels[a]} / {labels[b]}, throughput",
                                *(spread(egress_ratios(raw, a, b, k), "x") for k in KINDS)])
    rates = plan["rates"]
    intro = (f"{plan['rounds']} rounds, ways interleaved (the order rotates each round); median with "
             f"(min..max). Throughput: closed loop, {plan['connections']} keep-alive connections made before "
             f"the clock starts, {plan['seconds']:g} s per run. Latency: open loop at {num(rates['small'])} "
             f"req/s (small) and {num(rates['medium'])} req/s (medium), {plan['latency_seconds']:g} s per "
             "run, from each request's intended send time. Both by the harness's own generator "
             "(`bench/loadgen.py`: wrk cannot go through a CONNECT proxy); each connection is CONNECT "
             "(Proxy-Authorization), then TLS verified for the destination's name, then requests. "
             "CPU/request is the proxy's own CPU (for direct: the upstream's).")
    errors = sum(sum(c.get("errors", [])) for way in raw.values() for c in way.values())
    intro += (f" Transport errors (a run fails above 1 % of its requests): {errors} in all; no CONNECT "
              "was refused.")
    return "\n\n".join([intro, table(header, rows), "### Added latency and ratios (per round, then median)",
                        table(["comparison", *KINDS], comparisons)])


def _bulk(e: dict[str, Any]) -> str:
    def cell(name: str, metric: str) -> str:  # results saved before raw ends have none
        return spread(e["bulk"][name].get(metric, []), " MB/s")

    rows = [[label, cell(name, "mb_per_s"), cell(name, "mb_per_cpu_s"), cell(name, "raw_mb_per_s"),
             cell(name, "raw_mb_per_cpu_s")] for name, label in e["bulk_labels"].items()]
    plan = e["plan"]
    return "\n\n".join([
        f"{plan['bulk_rounds']} rounds of one {plan['bulk_mb']} MiB download through each tunnel "
        "(`bench/bulk.py`), two ways. *TLS end to end*: CONNECT, then TLS verified for the name, blocking "
        "sockets with 1 MiB reads and writes at both ends; the direct row is the ceiling of those two ends "
        "on this machine (each end's TLS and copy take a core of its own, so a relay between them can only "
        "share their cores). *Raw ends*: CONNECT, then a real ClientHello for the name (what a tunnel "
        "checks before relaying), then the server answers the bytes with no TLS at either end: the relay's "
        "own speed, the ends costing a copy each. *Per proxy CPU-second* divides the bytes by the CPU time "
        "the proxy itself used. The valetkey proxy relays a tunnel with splice(2) "
        "(`proxy/splice.py`: socket → pipe → socket in the kernel, once the ClientHello is checked and "
        "sent on), so its CPU is the kernel's moving of pages, not Python.",
        table(["way", "TLS end to end, wall clock", "TLS, per proxy CPU-second", "raw ends, wall clock",
               "raw, per proxy CPU-second"], rows)])


def _mint(e: dict[str, Any]) -> str:
    rows = []
    for key, label in (("mint", "valetkey (`proxy/certs.py`, CA from `contract/ca.py`)"),
                       ("srt_mint", "sandbox runtime (`mintLeafCert`)")):
        m = e.get(key)
        if not m:
            continue
        if "fresh_ms" not in m:
            rows.append([label, "—", "—", "—", m.get("todo") or m.get("error", "")])
            continue
        alone = f"{m['cert_only_ms']:.2f} ms" if "cert_only_ms" in m else "—"
        rows.append([label, f"{m['fresh_ms']:.2f} ms", f"{m['fresh_max_ms']:.2f} ms", alone,
                     f"{m['cached_ms'] * 1000:.2f} µs", f"{m['count']} new hosts; leaf key {m['key']}"])
    return "\n\n".join([
        "*New host*: what the first CONNECT to a name pays before its handshake (valetkey: the leaf "
        "minted and loaded into an `ssl.SSLContext`; the sandbox runtime: an RSA key pair generated and "
        "the leaf signed). *Certificate only*: the signed leaf without loading it. *Cached*: the same "
        "call for a name seen before.",
        table(["leaf certificate", "new host (median)", "new host (max)", "certificate only", "cached",
               "how"], rows)])


def _notes(results: Results) -> list[str]:
    e = results["egress"]
    notes = []
    if e.get("valetkey_missing"):
        notes.append(f"- **valetkey proxy rows missing**: {e['valetkey_missing']}.")
    elif e.get("valetkey_token_from") == "signed by the bench":
        notes.append("- The run's proxy credential was signed by the bench with the broker's transit key "
                     "(this broker bundles none yet), exactly as the broker signs one.")
    if "srt_manager_error" in e:
        notes.append(
            "- **Sandbox runtime**: its public entry point `SandboxManager.initialize()` refused to start "
            f"here: “{e['srt_manager_error']}” (a dependency check for the sandbox itself, not for the "
            "proxy). Its proxy runs on its own from the package's modules, wired as `SandboxManager` wires "
            "it (`bench/srt.py`, `bench/srt_proxy.mjs`): the same HTTP+SOCKS port in front, CONNECT with a "
            "Proxy-Authorization token and a host allowlist, TLS termination with its MITM CA, and header "
            "injection by its sentinel registry.")
    before = results.get("gateway_before") or {}
    notes.append(
        "- **Gateway mode**: table 1 above measured the gateway in this same run; the last target compares "
        f"it with the previous run's table 1 ({before.get('date', 'no previous figures')}): the proxy must "
        "not cost gateway mode anything.")
    return notes


def egress(results: Results) -> str:
    e = results["egress"]
    return "\n\n".join([
        "## 7. Egress proxy (issue 15)",
        "The valetkey proxy (`valetkey proxy serve`) in terminate mode (the credentialed upstream: the "
        "client sends the run's placeholder, the proxy injects the secret) and in tunnel mode (the client "
        "holds the credential; TLS end to end), side by side in one run with direct TLS, mitmproxy in "
        "regular mode (forward proxy, an addon injecting the secret; tunnel names in `ignore_hosts`) and the "
        "sandbox runtime's proxy, all against one local TLS upstream (`bench/upstream.py` with a test CA's "
        "certificate, names resolved by each proxy's own map to loopback). Every answer was 200 (the "
        "upstream answers 401 without the secret) and none contained the secret.",
        _targets(results), "\n".join(_notes(results)),
        "### Keep-alive requests", _requests(e),
        "### Bulk through a tunnel", _bulk(e),
        "### Leaf certificates", _mint(e)])


__all__ = ["Goal", "egress", "gateway_before"]
