"""Markdown for docs/benchmarks.md from the harness's results: one function per table, and the
targets of issue 6, each met or missed with the figure it was judged on."""

from __future__ import annotations

from typing import Any

from bench.egress_report import egress
from bench.proxy import KINDS, added, med, ratios
from bench.tables import num, spread, table
from bench.targets import targets

Results = dict[str, Any]
GENERATORS = {"wrk": "wrk (one thread)",
              "python closed loop": "the harness's own closed-loop generator (wrk is not installed)"}


def machine(results: Results) -> str:
    m = results["machine"]
    tools = "; ".join(f"{k}: {v}" for k, v in results["tools"].items())
    lines = [f"- **Machine**: {m['cores']} cores ({m['cpu']}), {m['memory']} memory, Linux {m['kernel']}, "
             f"Python {m['python']}; {m['calibration']} (run `python -m timeit 'sum(range(1000))'` on "
             "yours to scale the absolute figures).",
             f"- **Date**: {m['date']}; commit `{m['commit']}` (uncommitted changes: {m['dirty']}).",
             f"- **Command**: `{results['command']}`.",
             f"- **Tools**: {tools}."]
    if "outside_cpu_run" in results:
        lines.append(f"- **Other load**: processes outside the harness (the machine is shared) used "
                     f"{results['outside_cpu_run']:.0%} of its CPU capacity during the run, "
                     f"{results.get('outside_cpu_proxy', 0.0):.0%} during table 1; run time "
                     f"{results.get('elapsed_s', 0) / 60:.0f} min.")
    lines += [f"- **Skipped**: {line}" for line in results.get("skipped", [])]
    lines.append("- Everything runs on this one machine over loopback: upstream, proxies, Redis, OpenBao and "
                 "the load generators share its cores, so absolute figures are lower than on a dedicated "
                 "box; the ratios, taken round by round, are the figures to compare.")
    return "\n".join(lines)


def proxy(results: Results) -> str:
    p = results["proxy"]
    raw, labels, plan = p["raw"], p["labels"], p["plan"]
    rates = plan["rates"]
    intro = (f"{plan['rounds']} rounds, targets interleaved (the order rotates each round); median over "
             "rounds with (min..max). Throughput: closed loop, "
             f"{GENERATORS.get(p['generator'], p['generator'])}, {plan['connections']} connections, "
             f"{plan['seconds']:g} s per run. "
             f"Latency: open loop at a fixed {num(rates['small'])} req/s (small) and {num(rates['medium'])} "
             f"req/s (medium) for {plan['latency_seconds']:g} s per run, measured from each request's "
             "intended send time (no coordinated omission), by the harness's own generator "
             "(`bench/loadgen.py`, asyncio on `select()`): wrk2 is not in Debian, and wrk's Lua hooks "
             "cannot make it open-loop honestly. CPU/request is the proxy's own CPU time (for direct: the "
             "upstream's) divided by the requests of the throughput run. Every response was 200 "
             "(the upstream answers 401 unless the injected secret arrived), and no response that the "
             "latency and warm-up runs read contained the secret.")
    tp_rows, lat_rows = [], []
    for name, label in labels.items():
        small, medium = raw[name]["small"], raw[name]["medium"]
        tp_rows.append([label, spread(small["rps"]), spread(small["cpu_ms"]), spread(medium["rps"]),
                        spread(medium["cpu_ms"])])
        lat_rows.append([label, spread(small["p50"]), spread(small["p99"]), spread(medium["p50"]),
                         spread(medium["p99"])])
    tp = table(["target", "small req/s", "small CPU ms/req", "medium req/s", "medium CPU ms/req"], tp_rows)
    lat = table(["target", "small p50 ms", "small p99 ms", "medium p50 ms", "medium p99 ms"], lat_rows)
    lateness = max((max(raw[n][k]["lateness_p99"], default=0.0) for n in raw for k in KINDS), default=0.0)
    gwn = next((n for n in labels if n.startswith("gateway-") and n != "gateway-1"), "")
    comparisons = [
        ("gateway (1 worker) / mitmproxy, throughput", ratios(raw, "gateway-1", "mitmproxy", "small"),
         ratios(raw, "gateway-1", "mitmproxy", "medium"), "x"),
        ("gateway (1 worker) / nginx, throughput", ratios(raw, "gateway-1", "nginx", "small"),
         ratios(raw, "gateway-1", "nginx", "medium"), "x"),
        (f"{labels.get(gwn, '')} / nginx, throughput", ratios(raw, gwn, "nginx", "small"),
         ratios(raw, gwn, "nginx", "medium"), "x"),
        ("mitmproxy / nginx, throughput", ratios(raw, "mitmproxy", "nginx", "small"),
         ratios(raw, "mitmproxy", "nginx", "medium"), "x"),
        ("Python floor / nginx, throughput", ratios(raw, "floor", "nginx", "small"),
         ratios(raw, "floor", "nginx", "medium"), "x"),
        ("gateway (1 worker) / Python floor, throughput", ratios(raw, "gateway-1", "floor", "small"),
         ratios(raw, "gateway-1", "floor", "medium"), "x"),
    ]
    for name in ("nginx", "mitmproxy", "floor", "gateway-1", gwn):
        for metric in ("p50", "p99"):
            comparisons.append((f"{labels.get(name, name)}: {metric} added over direct",
                                added(raw, name, "small", metric), added(raw, name, "medium", metric), " ms"))
    ratio_rows = [[what, spread(s, unit), spread(m, unit)] for what, s, m, unit in comparisons if s or m]
    return "\n\n".join([
        "## 1. Injection proxy overhead", intro,
        f"Small: {KINDS['small'].what}; medium: {KINDS['medium'].what}. The upstream is "
        "`bench/upstream.py` (uvicorn, one process).",
        "### Throughput at fixed concurrency", tp,
        "### Latency at a fixed moderate rate", lat,
        f"The generator's own lateness (actual minus intended send time) was at most {num(lateness)} ms "
        "at p99 in any run; it is inside every figure above, direct included, and cancels in the "
        "differences below.",
        "### Ratios and added latency (per round, then median)",
        table(["comparison", "small", "medium"], ratio_rows)])


def sse(results: Results) -> str:
    s = results["sse"]
    rows = [[label, f"{s[key]['count']:,}", spread([s[key]["p50"]]), spread([s[key]["p99"]]),
             spread([s[key]["max"]])] for key, label in (("direct", "direct"),
                                                         ("gateway", "gateway (1 worker)"))]
    return "\n\n".join([
        "## 2. Server-sent events pass-through",
        f"{s['streams']} concurrent streams x {s['events']} events (one every 20 ms), {s['rounds']} rounds; "
        "latency = client receive time minus the emission time the upstream wrote into the event "
        "(same clock). Added by the gateway: "
        f"{num(s['gateway']['p50'] - s['direct']['p50'])} ms at the median.",
        table(["path", "events", "median ms", "p99 ms", "max ms"], rows)])


def redaction(results: Results) -> str:
    r = results.get("redaction", {})
    if r.get("output"):
        body = ("`python -m bench.redact` in this run (its method, the worst cases and the matcher "
                f"choice are in [Redaction](#redaction) below):\n\n```text\n{r['output']}\n```")
    else:
        body = f"TODO: {r.get('todo', 'bench/redact.py not run')}"
    return "\n\n".join(["## 3. Redaction throughput", body])


def tokens(results: Results) -> str:
    t = results["tokens"]
    rows = [
        ["verify, distinct tokens (one core)", spread(t["verify_distinct_per_s"]),
         f"{t['distinct_tokens']:,} tokens, each once, fresh verifier per round"],
        ["the floor: bare Ed25519 verify (`cryptography`)", spread(t.get("raw_ed25519_per_s", [])),
         "a 600-byte message, no parsing: the most any verifier of distinct tokens can do here"],
        ["verify, one repeated token (one core)", spread(t["verify_repeated_per_s"]),
         f"{t['repeated_calls']:,} calls per round"],
        ["mint: broker `POST /v1/runs`", spread(t["mint_per_s"]),
         f"{t['concurrency']} in flight, {t['seconds']:g} s per round, "
         f"load from {t.get('mint_generator', 'httpx (in the harness process)')}"],
        ["raw `TransitSigner.sign`, one token per call", spread(t["sign_one_per_s"]),
         f"{t['concurrency']} in flight"],
        ["raw `TransitSigner.sign`, batches (tokens/s)", spread(t["batch_sign_per_s"]),
         f"{t['batch']} tokens per Vault call"],
    ]
    return "\n\n".join(["## 4. Tokens", f"{t['rounds']} rounds; median (min..max).",
                        table(["operation", "per second", "how"], rows)])


def revocation(results: Results) -> str:
    rows = [[str(r["replicas"]), str(r["trials"]), num(r["p50_ms"]), num(r["p99_ms"]),
             num(r["slowest_p50_ms"]), num(r["slowest_p99_ms"]), num(r["max_ms"]),
             num(r["from_call_start_p50_ms"]), num(r["from_call_start_p99_ms"])]
            for r in results["revocation"]]
    return "\n\n".join([
        "## 5. Revocation propagation",
        "`bench/revocation.py`: time from `POST /v1/revocations` returning to the first refused request "
        "at each gateway replica (real processes, Redis pub/sub; 0 = already refusing when the call "
        "returned). The last two columns count from the moment the call was made instead (they include "
        "the broker's own handling of the call).",
        table(["replicas", "trials", "p50 ms", "p99 ms", "slowest replica p50", "slowest replica p99",
               "max ms", "from call start p50", "from call start p99"], rows)])


def memory(results: Results) -> str:
    m = results["memory"]
    n = m["workers"]
    rows = [["gateway, 1 worker", num(m["gateway_1_start"]), num(m["gateway_1_idle"]),
             num(m["gateway_1_load"])],
            [f"gateway, {n} workers (sum of workers)", num(m["gateway_n_start"]), num(m["gateway_n_idle"]),
             num(m["gateway_n_load"])],
            [f"gateway, {n} workers: supervisor", num(m["gateway_n_supervisor"]), "", ""],
            ["broker", num(m["broker_start"]), num(m["broker_idle"]), num(m["broker_load"])]]
    return "\n\n".join([
        "## 6. Memory",
        "VmRSS in MB. *Start*: ready, before any request; *idle*: after the warm-up (connections pooled, "
        "redaction patterns compiled), before the load; *under load*: peak sampled every 250 ms during "
        "the throughput runs (the broker: during the mint runs). The 10-minute soak is its own command "
        "and section below.",
        table(["process", "start", "idle", "under load"], rows)])


def profile(results: Results) -> str:
    from bench.profile import markdown

    runs = results.get("profile") or []
    if not runs:
        return ""
    parts = ["## Profile of one gateway worker",
             "Taken by the harness because a gateway target was missed (`python -m bench.profile` "
             "reproduces it)."]
    parts += [markdown(run) for run in runs]
    return "\n\n".join(parts)


def sources(results: Results) -> str:
    r = results.get("sources", {})
    body = (f"`python -m bench.sources` in this run (what it measures: [Run-scoped credentials]"
            f"(#run-scoped-credentials) below):\n\n```text\n{r['output']}\n```" if r.get("output")
            else f"TODO: {r.get('todo', 'bench/sources.py not run')}")
    parts = ["## 8. Run-scoped credential sources", body]
    if r.get("pg"):
        parts += ["`python -m bench.pg_issuance --runs 20` in this run (per-run database leases; the "
                  "Postgres gateway issues a run's lease at run creation):", r["pg"]]
    return "\n\n".join(parts)


def render(results: Results) -> str:

    parts = ["## Machine and run", machine(results), targets(results)]
    for section in (proxy, sse, redaction, tokens, revocation, memory, egress, profile, sources):
        try:
            text = section(results)
        except KeyError as exc:
            text = f"## {section.__name__}\n\nnot measured in this run ({exc})"
        if text:
            parts.append(text)
    return "\n\n".join(parts) + "\n"


__all__ = ["med", "render", "spread", "table"]
