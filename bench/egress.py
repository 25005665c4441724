"""Table 7: the egress proxy — valetkey's proxy in terminate and tunnel mode, side by side in one
run with direct TLS, mitmproxy (regular mode + injection addon) and the sandbox runtime's proxy.

One local TLS upstream (``bench/upstream.py`` with the test CA's certificate) answers for two
names: ``API_HOST`` (the credentialed upstream: terminated, the client sends a placeholder and
the proxy injects the secret) and ``TUNNEL_HOST`` (tunnel mode: the client holds the secret, TLS
is end to end). Per round, every way in turn (the order rotates), for the small and medium
requests of table 1, over keep-alive connections made once (CONNECT, then TLS, then requests):
throughput in a closed loop and p50/p99 latency in an open loop at a fixed rate (the harness's own
generator, ``bench/loadgen.py``: wrk cannot go through a CONNECT proxy). Then bulk transfer
through each tunnel (``bench/bulk.py``), and the cost of a new leaf certificate and a cached one
(``proxy/certs.py`` itself, and the sandbox runtime's ``mintLeafCert``).

Any non-200, refused CONNECT or secret seen in an answer fails the run, as in table 1.
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import bulk
from bench.egress_procs import BulkServer, MitmForward, TlsUpstream
from bench.proxy import KINDS, BenchFailure, Kind, checked, run_loadgen, settle
from bench.rss import Sampler, cpu_seconds
from bench.srt import SrtProxy, find_srt, srt_mint, srt_version
from bench.testca import API_HOST, BULK_HOST, TUNNEL_HOST, TestCA
from bench.tools import find_mitmdump, version
from valetkey.dev.services import free_port


@dataclass(frozen=True)
class EgressPlan:
    rounds: int = 3
    seconds: float = 4.0  # each throughput run
    connections: int = 16
    latency_seconds: float = 6.0  # each open-loop run
    rates: dict[str, float] = field(default_factory=lambda: {"small": 50.0, "medium": 20.0})
    warmup: float = 1.0
    bulk_bytes: int = 256 << 20
    bulk_rounds: int = 3
    mints: int = 20


SMOKE_PLAN = EgressPlan(rounds=1, seconds=0.5, connections=2, latency_seconds=0.5,
                        rates={"small": 20.0, "medium": 10.0}, warmup=0.3, bulk_bytes=4 << 20, bulk_rounds=1,
                        mints=2)


@dataclass
class Way:
    """One way to reach the upstream: dial ``dial_port`` (a proxy, or the upstream itself), reach
    ``host:port`` (by CONNECT when ``proxy_auth`` is set), trust ``ca``, send ``auth``."""

    name: str
    label: str
    mode: str  # direct | terminate | tunnel
    dial_port: int
    host: str
    port: int
    ca: str
    auth: str
    proxy_auth: str | None = None
    pids: Callable[[], list[int]] = field(default=lambda: [])

    def spec(self, kind: Kind, secret: str, **extra: Any) -> dict[str, Any]:
        spec = {"host": "127.0.0.1", "port": self.dial_port, "authority": f"{self.host}:{self.port}",
                "tls": {"ca": self.ca, "sni": self.host}, "method": kind.method, "path": kind.path,
                "body_size": kind.body_size, "headers": [["Authorization", self.auth]], "secret": secret,
                **extra}
        if self.proxy_auth:
            spec["proxy_auth"] = self.proxy_auth
        return spec


def strict(result: dict[str, Any], where: str) -> dict[str, Any]:
    """Table 1's checks, plus: no CONNECT refused, and transport errors under 1 % of the requests."""
    if result.get("connect_refused"):
        raise BenchFailure(f"{where}: CONNECT refused {result['connect_refused']}")
    if result.get("errors", 0) > max(1, result.get("completed", 0) // 100):
        raise BenchFailure(f"{where}: {result['errors']} requests failed at the transport")
    return checked(result, where)


def compare(ways: list[Way], plan: EgressPlan, secret: str, log: Callable[[str], None]) -> dict[str, Any]:
    """Every way and request kind, ``plan.rounds`` times interleaved; raw per-round figures."""
    metrics = ("rps", "p50", "p99", "cpu_ms", "rss_peak", "errors")
    raw: dict[str, dict[str, dict[str, list[float]]]] = {
        w.name: {k: {m: [] for m in metrics} for k in KINDS} for w in ways}
    for w in ways:  # proof (200, no secret back) and warm-up: connections, leaves and pools made
        for kind in KINDS.values():
            strict(run_loadgen(w.spec(kind, secret, mode="closed", connections=2, duration=plan.warmup)),
                   f"{w.label} warm-up ({kind.name})")
    for r in range(plan.rounds):
        for w in ways[r % len(ways):] + ways[:r % len(ways)]:
            for kind in KINDS.values():
                where = f"round {r + 1}, {w.label}, {kind.name}"
                sampler, before = Sampler(w.pids), cpu_seconds(w.pids())
                with sampler:
                    tp = strict(run_loadgen(w.spec(kind, secret, mode="closed", connections=plan.connections,
                                                   duration=plan.seconds, prewarm=True)),
                                f"{where}, throughput")
                cpu = cpu_seconds(w.pids()) - before
                settle(w.pids)
                lat = strict(run_loadgen(w.spec(kind, secret, mode="open", rate=plan.rates[kind.name],
                                                duration=plan.latency_seconds, connections=8, prewarm=True)),
                             f"{where}, latency")
                cell = raw[w.name][kind.name]
                cell["rps"].append(tp["rps"])
                cell["p50"].append(lat["latency_ms"]["p50"])
                cell["p99"].append(lat["latency_ms"]["p99"])
                cell["cpu_ms"].append(round(1000 * cpu / tp["completed"], 3) if tp["completed"] else 0.0)
                cell["rss_peak"].append(sampler.peak)
                cell["errors"].append(tp.get("errors", 0) + lat.get("errors", 0))
                log(f"  {where}: {tp['rps']:,.0f} req/s; p50 {lat['latency_ms']['p50']:.2f} ms, "
                    f"p99 {lat['latency_ms']['p99']:.2f} ms")
    return raw


def bulk_rates(ways: list[Way], plan: EgressPlan,
               log: Callable[[str], None]) -> dict[str, dict[str, list[float]]]:
    """MB/s through each tunnel (wall clock), and MB per CPU-second of the proxy itself: with TLS
    end to end, and with raw ends (``bulk.fetch_raw``: the relay's own speed)."""
    metrics = ("mb_per_s", "mb_per_cpu_s", "raw_mb_per_s", "raw_mb_per_cpu_s")
    out: dict[str, dict[str, list[float]]] = {w.name: {m: [] for m in metrics} for w in ways}
    for r in range(plan.bulk_rounds):
        for w in ways[r % len(ways):] + ways[:r % len(ways)]:
            for prefix, fetch in (("", _tls_fetch), ("raw_", _raw_fetch)):
                before = cpu_seconds(w.pids())
                try:
                    got = fetch(w, plan.bulk_bytes)
                except OSError as exc:
                    raise BenchFailure(f"bulk ({prefix or 'tls'}), {w.label}: {exc}") from None
                cpu = cpu_seconds(w.pids()) - before
                out[w.name][f"{prefix}mb_per_s"].append(got["mb_per_s"])
                if w.mode != "direct" and cpu > 0:
                    out[w.name][f"{prefix}mb_per_cpu_s"].append(round(got["bytes"] / cpu / 1e6, 1))
                log(f"  bulk round {r + 1}, {w.label}{', raw ends' if prefix else ''}: "
                    f"{got['mb_per_s']:,.0f} MB/s")
    return out


def _tls_fetch(w: Way, size: int) -> dict[str, Any]:
    return bulk.fetch("127.0.0.1", w.dial_port, authority=f"{w.host}:{w.port}", sni=w.host, ca=w.ca,
                      size=size, proxy_auth=w.proxy_auth)


def _raw_fetch(w: Way, size: int) -> dict[str, Any]:
    return bulk.fetch_raw("127.0.0.1", w.dial_port, authority=f"{w.host}:{w.port}", sni=w.host, size=size,
                          proxy_auth=w.proxy_auth)


def leaf_mint(count: int) -> dict[str, Any]:
    """``proxy/certs.py``'s ``LeafCerts`` on a CA from ``contract/ca.py``: the TLS context for a
    new host (the leaf minted and loaded: what a CONNECT to a new name pays), and a cached one."""
    try:
        from contract.ca import generate_ca
        from proxy.certs import LeafCerts
    except ImportError:
        return {"todo": "proxy/certs.py is not in this checkout"}
    material = generate_ca()

    async def load_ca() -> tuple[bytes, bytes]:
        return material.cert_pem.encode(), material.key_pem.reveal().encode()

    leaves = LeafCerts(load_ca)
    asyncio.run(leaves.load())
    fresh, cached, alone = [], [], []
    for i in range(count):  # the certificate alone: what minting costs before ``ssl`` loads it
        started = time.perf_counter()
        leaves.mint(f"cert{i}.mint.bench.valetkey.test")
        alone.append((time.perf_counter() - started) * 1000)
    for i in range(count):
        started = time.perf_counter()
        leaves.context(f"host{i}.mint.bench.valetkey.test")
        fresh.append((time.perf_counter() - started) * 1000)
    for _ in range(10_000):
        started = time.perf_counter()
        leaves.context("host0.mint.bench.valetkey.test")
        cached.append((time.perf_counter() - started) * 1000)
    return {"fresh_ms": round(statistics.median(fresh), 3), "fresh_max_ms": round(max(fresh), 3),
            "cert_only_ms": round(statistics.median(alone), 3),
            "cached_ms": round(statistics.median(cached), 5), "count": count,
            "key": "EC P-256 (cryptography)"}


def ways_of(scope: ExitStack, ca: TestCA, tls_port: int, bulk_port: int, secret: str, results: dict[str, Any],
            vk: Any) -> tuple[list[Way], list[Way]]:
    """(request ways, bulk ways): every target this machine can run; the others go to ``skipped``."""
    up = scope.enter_context(TlsUpstream(ca, secret, tls_port))
    bulk_server = scope.enter_context(BulkServer(ca, bulk_port))
    ways = [Way("direct", "direct TLS (no proxy)", "direct", tls_port, API_HOST, tls_port, str(ca.ca),
                f"Bearer {secret}", pids=lambda: [up.pid])]
    bulks = [Way("direct", "direct TLS (no proxy)", "direct", bulk_port, BULK_HOST, bulk_port, str(ca.ca), "",
                 pids=lambda: [bulk_server.pid])]
    if vk is not None:
        pids = lambda: [vk.pid]  # noqa: E731
        ways += [Way("valetkey-terminate", "valetkey proxy, terminate (secret injected)", "terminate",
                     vk.port, API_HOST, tls_port, str(vk.client_ca), f"Bearer {vk.placeholder}",
                     vk.proxy_auth, pids),
                 Way("valetkey-tunnel", "valetkey proxy, tunnel", "tunnel", vk.port, TUNNEL_HOST, tls_port,
                     str(ca.ca), f"Bearer {secret}", vk.proxy_auth, pids)]
        bulks.append(Way("valetkey-tunnel", "valetkey proxy, tunnel", "tunnel", vk.port, BULK_HOST, bulk_port,
                         str(ca.ca), "", vk.proxy_auth, pids))
    mitmdump = find_mitmdump()
    if mitmdump:
        results["tools"]["mitmproxy"] = version([mitmdump, "--version"])
        mitm = scope.enter_context(MitmForward(mitmdump, secret, ca))
        mpids = lambda: [mitm.pid]  # noqa: E731
        ways += [Way("mitmproxy-terminate", "mitmproxy (regular mode + addon)", "terminate", mitm.port,
                     API_HOST, tls_port, str(mitm.client_ca), "Bearer placeholder", "Basic cnVuOng=", mpids),
                 Way("mitmproxy-tunnel", "mitmproxy (regular mode, ignore_hosts)", "tunnel", mitm.port,
                     TUNNEL_HOST, tls_port, str(ca.ca), f"Bearer {secret}", "Basic cnVuOng=", mpids)]
        bulks.append(Way("mitmproxy-tunnel", "mitmproxy (regular mode, ignore_hosts)", "tunnel", mitm.port,
                         BULK_HOST, bulk_port, str(ca.ca), "", "Basic cnVuOng=", mpids))
    else:
        results["skipped"].append("mitmproxy (table 7): not installed "
                                  "(./scripts/bench installs it into .venv-bench)")
    package = find_srt()
    if package:
        srt = scope.enter_context(SrtProxy(
            package, allowed=[API_HOST, TUNNEL_HOST, BULK_HOST],
            resolve={h: "127.0.0.1" for h in (API_HOST, TUNNEL_HOST, BULK_HOST)},
            tunnel=[TUNNEL_HOST, BULK_HOST],
            inject_host=API_HOST, secret=secret, upstream_ca=ca.ca))
        results["tools"]["sandbox-runtime"] = f"@anthropic-ai/sandbox-runtime {srt_version(package)} " \
                                              f"(Node {srt.info.get('node', '?')})"
        results["egress"]["srt_manager_error"] = srt.info.get("manager_error", "")
        spids = lambda: [srt.pid]  # noqa: E731
        ways += [Way("srt-terminate", "sandbox runtime proxy, TLS terminate + sentinel injection",
                     "terminate", srt.port, API_HOST, tls_port, srt.client_ca, f"Bearer {srt.sentinel}",
                     srt.proxy_auth, spids),
                 Way("srt-tunnel", "sandbox runtime proxy, tunnel", "tunnel", srt.port, TUNNEL_HOST, tls_port,
                     str(ca.ca), f"Bearer {secret}", srt.proxy_auth, spids)]
        bulks.append(Way("srt-tunnel", "sandbox runtime proxy, tunnel", "tunnel", srt.port, BULK_HOST,
                         bulk_port, str(ca.ca), "", srt.proxy_auth, spids))
        results["egress"]["srt_mint"] = srt_mint(package, 3 if results.get("smoke") else 5)
    else:
        results["skipped"].append("sandbox runtime proxy (table 7): not installed (./scripts/bench installs "
                                  "@anthropic-ai/sandbox-runtime from npm into .bench-node)")
    return ways, bulks


def measure(plan: EgressPlan, results: dict[str, Any], log: Callable[[str], None] = print) -> None:
    """Fill ``results["egress"]``: raw per-round figures by way, bulk rates, leaf mints, notes."""
    from bench import valetkey_proxy

    results["egress"] = {"plan": {"rounds": plan.rounds, "seconds": plan.seconds,
                                  "connections": plan.connections, "latency_seconds": plan.latency_seconds,
                                  "rates": plan.rates, "bulk_mb": plan.bulk_bytes >> 20,
                                  "bulk_rounds": plan.bulk_rounds}}
    egress = results["egress"]
    workdir = Path(tempfile.mkdtemp(prefix="valetkey-bench-egress-"))
    ca = TestCA.create(workdir / "ca")
    tls_port, bulk_port = free_port(), free_port()
    with ExitStack() as scope:
        vk, secret = None, "bench-egress-" + secrets.token_hex(16)
        why_not = valetkey_proxy.missing()
        if why_not is None:
            try:
                vk = valetkey_proxy.start(scope, ca, tls_port, bulk_port, workdir)
                secret = vk.secret
                egress["valetkey_token_from"] = vk.token_from
            except Exception as exc:  # the other rows still run; the reason is reported
                why_not = f"the valetkey proxy did not start: {str(exc)[-300:]}"
        if why_not:
            egress["valetkey_missing"] = why_not
            results["skipped"].append(f"valetkey proxy (table 7): {why_not}")
        ways, bulks = ways_of(scope, ca, tls_port, bulk_port, secret, results, vk)
        egress["labels"] = {w.name: w.label for w in ways}
        egress["modes"] = {w.name: w.mode for w in ways}
        log("7. egress proxy: requests")
        egress["raw"] = compare(ways, plan, secret, log)
        log("7. egress proxy: bulk through tunnels")
        egress["bulk"] = bulk_rates(bulks, plan, log)
        egress["bulk_labels"] = {w.name: w.label for w in bulks}
    egress["mint"] = leaf_mint(plan.mints)
