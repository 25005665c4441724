"""The benchmark harness of issue 6: every table of docs/benchmarks.md from one command.

    python -m bench.run [--doc docs/benchmarks.md] [--out FILE] [--json FILE] [--rounds N]
    python -m bench.run --smoke        # seconds, tiny loads: checks the harness, not the speed

Starts the whole stack on loopback (OpenBao dev, Redis, bootstrap, the fast upstream, the broker,
a one-worker gateway and one with a worker per core), nginx and mitmproxy when installed (each
missing tool is skipped with a line saying so; direct and gateway rows always run), then
measures: 1 proxy overhead, 2 SSE pass-through, 4 tokens, 6 memory (and a py-spy profile of the
gateway when one of its targets is missed); then 3 redaction (``bench/redact.py``),
5 revocation propagation (``bench/revocation.py``) and 7 the egress proxy (``bench/egress.py``),
which start stacks of their own. Any non-200
or a secret seen by a client fails the run (exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench import docfile, egress, report, targets
from bench.egress_report import gateway_before
from bench.loadgen import percentile
from bench.profile import profile_gateway
from bench.proxy import KINDS, BenchFailure, Plan, Target, checked, compare, run_loadgen, spec_for, warm
from bench.revocation import measure as revocation
from bench.rss import OutsideLoad, children, rss_mb, total_mb, wait_quiet, workers_of
from bench.stack import BenchStack
from bench.tokens import measure as token_rates
from bench.tools import Floor, Mitmproxy, Nginx, find_mitmdump, find_nginx, find_pyspy, find_wrk, version

REPO = Path(__file__).resolve().parent.parent
SECTIONS = ("proxy", "sse", "tokens", "profile", "redaction", "revocation", "egress", "sources")


@dataclass(frozen=True)
class Config:
    plan: Plan
    sse_events: int = 100
    sse_streams: int = 4
    sse_rounds: int = 3
    distinct: int = 5000
    repeated: int = 200_000
    token_rounds: int = 3
    token_seconds: float = 5.0
    concurrency: int = 16
    replicas: tuple[int, ...] = (1, 4, 8)
    trials: int = 30
    profile_seconds: float = 10.0
    smoke: bool = False
    sections: tuple[str, ...] = field(default=SECTIONS)
    egress: egress.EgressPlan = field(default_factory=egress.EgressPlan)


FULL = Config(Plan(rounds=3, seconds=8.0, connections=32, latency_seconds=10.0,
                   rates={"small": 50.0, "medium": 20.0}))
SMOKE = Config(Plan(rounds=1, seconds=1.0, connections=4, latency_seconds=1.0,
                    rates={"small": 20.0, "medium": 10.0}, warmup=0.3),
               sse_events=5, sse_streams=1, sse_rounds=1, distinct=40, repeated=2000, token_rounds=1,
               token_seconds=0.5, concurrency=4, replicas=(1,), trials=2, smoke=True,
               sections=("proxy", "sse", "tokens", "redaction", "revocation", "egress"),
               egress=egress.SMOKE_PLAN)


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def sse(stack: BenchStack, token: str, cfg: Config) -> dict[str, Any]:
    pooled: dict[str, list[float]] = {"direct": [], "gateway": []}
    ends = {"direct": (f"http://127.0.0.1:{stack.upstream_port}", f"Bearer {stack.secret}"),
            "gateway": (stack.gateway_urls[0], f"Bearer {token}")}
    for _ in range(cfg.sse_rounds):
        for key, (url, auth) in ends.items():
            result = checked(run_loadgen(spec_for(url, auth, KINDS["small"], stack.secret, mode="sse",
                                                  path="/v1/sse", events=cfg.sse_events,
                                                  streams=cfg.sse_streams, raw=True)), f"SSE {key}")
            if result["errors"]:
                raise BenchFailure(f"SSE {key}: {result['errors']} streams did not deliver every event")
            pooled[key] += result["latencies_ms"]
    out: dict[str, Any] = {"events": cfg.sse_events, "streams": cfg.sse_streams, "rounds": cfg.sse_rounds}
    for key, values in pooled.items():
        ordered = sorted(values)
        out[key] = {"count": len(ordered), "p50": round(percentile(ordered, 50), 3),
                    "p99": round(percentile(ordered, 99), 3), "max": round(max(ordered), 3)}
    return out


def redaction(cfg: Config) -> dict[str, str]:
    if not (REPO / "bench" / "redact.py").exists():
        return {"todo": "bench/redact.py does not exist yet (its owner is writing it); "
                        "rerun `./scripts/bench` once it does"}
    argv = [sys.executable, "-m", "bench.redact"]
    if cfg.smoke:
        helptext = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=60,  # noqa: S603
                                  check=False, cwd=REPO).stdout
        if "--smoke" not in helptext:
            return {"todo": "skipped in smoke mode (bench/redact.py has no --smoke)"}
        argv.append("--smoke")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False,  # noqa: S603
                          cwd=REPO)
    if done.returncode != 0:
        return {"todo": f"bench/redact.py failed ({done.returncode}): {done.stderr.strip()[-400:]}"}
    return {"output": done.stdout.strip()}


def audit_refusals(redis_url: str, limit: int = 5000) -> str:
    """The gateway's own word on its non-200 answers: status and reason from the audit stream."""
    import redis

    from contract.redis_url import sync_client

    client = sync_client(redis_url)
    try:
        entries = client.xrevrange("valetkey:audit", count=limit)
    except redis.RedisError as exc:
        return f"audit stream unreadable ({type(exc).__name__})"
    finally:
        client.close()
    reasons: Counter[str] = Counter()
    for _, fields in entries or []:
        if (fields or {}).get(b"kind") != b"request":
            continue
        line = json.loads((fields or {}).get(b"line", b"{}"))
        if line.get("status") != 200:
            reasons[f"{line.get('status')} {line.get('decision')}/{line.get('reason')}"] += 1
    found = ", ".join(f"{k} x{n}" for k, n in reasons.most_common(5))
    return f"gateway audit (last {len(entries or [])} lines): {found or 'every line is 200'}"


def proxies(stack: BenchStack, scope: ExitStack, token: str, cores: int,
            results: dict[str, Any]) -> tuple[list[Target], dict[str, Any]]:
    """The targets of table 1 (direct, nginx, mitmproxy, both gateways) and their memory at start."""
    upstream_pid = stack.procs[0].pid
    gw1, gwn = stack.gateway_procs[0].pid, stack.gateway_procs[1].pid if cores > 1 else 0
    placeholder = f"Bearer {token}"
    found: list[Target] = [Target("direct", "direct (no proxy)", f"http://127.0.0.1:{stack.upstream_port}",
                                  f"Bearer {stack.secret}", lambda: [upstream_pid])]
    nginx, mitmdump = find_nginx(), find_mitmdump()
    if nginx:
        results["tools"]["nginx"] = version([nginx, "-v"])
        proc = scope.enter_context(Nginx(nginx, stack.upstream_port, stack.secret))
        found.append(Target("nginx", "nginx (1 worker)", proc.url, placeholder,
                            lambda: [proc.pid, *children(proc.pid)]))
    else:
        results["skipped"].append("nginx: not installed (./scripts/bench installs it with apt-get)")
    if mitmdump:
        results["tools"]["mitmproxy"] = version([mitmdump, "--version"])
        mitm = scope.enter_context(Mitmproxy(mitmdump, stack.upstream_port, stack.secret))
        found.append(Target("mitmproxy", "mitmproxy (reverse mode + addon)", mitm.url, placeholder,
                            lambda: [mitm.pid]))
    else:
        results["skipped"].append("mitmproxy: not installed (./scripts/bench installs it into .venv-bench)")
    floor = scope.enter_context(Floor(stack.upstream_port, stack.secret))
    found.append(Target("floor", "Python floor: bare forwarder, no checks", floor.url, placeholder,
                        lambda: [floor.pid]))
    audit = functools.partial(audit_refusals, stack.redis_url)
    found.append(Target("gateway-1", "valetkey gateway, 1 worker", stack.gateway_urls[0], placeholder,
                        lambda: [gw1], audit))
    if cores > 1:
        found.append(Target(f"gateway-{cores}", f"valetkey gateway, {cores} workers", stack.gateway_urls[1],
                            placeholder, lambda: workers_of(gwn, cores), audit))
    memory = {"workers": cores, "gateway_1_start": rss_mb(gw1),
              "gateway_n_start": total_mb(workers_of(gwn, cores)) if gwn else 0.0,
              "gateway_n_supervisor": rss_mb(gwn) if gwn else 0.0}
    return found, memory


def measure_stack(cfg: Config, results: dict[str, Any]) -> None:
    cores = os.cpu_count() or 1
    wrk = find_wrk()
    if wrk:
        results["tools"]["wrk"] = version([wrk, "--version"])
    else:
        results["skipped"].append("wrk: not installed; throughput comes from the harness's closed-loop "
                                  "generator instead")
    with BenchStack() as stack, ExitStack() as scope:
        if cores > 1:
            stack.add_gateway(cores)
        token = stack.mint()["env"]["BENCH_TOKEN"]
        if stack.broker is None:
            raise RuntimeError("no broker")
        broker_start = rss_mb(stack.broker.pid)
        found, memory = proxies(stack, scope, token, cores, results)
        memory["broker_start"] = broker_start
        results["memory"] = memory
        if "proxy" in cfg.sections:
            log("1. proxy overhead: warm-up")
            warm(found, cfg.plan, stack.secret)
            gw1 = stack.gateway_procs[0].pid
            memory["gateway_1_idle"] = rss_mb(gw1)
            if cores > 1:
                memory["gateway_n_idle"] = total_mb(workers_of(stack.gateway_procs[1].pid, cores))
            outside = OutsideLoad()
            results["proxy"] = compare(found, cfg.plan, wrk, stack.secret, log)
            results["outside_cpu_proxy"] = round(outside.share(), 3)
            raw = results["proxy"]["raw"]
            memory["gateway_1_load"] = max(max(raw["gateway-1"][k]["rss_peak"]) for k in KINDS)
            if cores > 1:
                memory["gateway_n_load"] = max(max(raw[f"gateway-{cores}"][k]["rss_peak"]) for k in KINDS)
        if "sse" in cfg.sections:
            log("2. SSE pass-through")
            results["sse"] = sse(stack, token, cfg)
        if "tokens" in cfg.sections:
            log("4. tokens")
            results["tokens"] = asyncio.run(token_rates(
                stack, distinct=cfg.distinct, repeated=cfg.repeated, rounds=cfg.token_rounds,
                seconds=cfg.token_seconds, concurrency=cfg.concurrency))
            memory["broker_idle"] = results["tokens"]["broker_rss_idle_mb"]
            memory["broker_load"] = results["tokens"]["broker_rss_load_mb"]
        gateway_missed = [m for m in targets.missed(results) if "gateway" in m or "SSE" in m]
        if "profile" in cfg.sections and gateway_missed and "proxy" in results:
            if find_pyspy() is None:
                results["skipped"].append("profile: py-spy not installed")
            else:
                log("profiling one gateway worker (targets missed)")
                results["profile"] = [
                    profile_gateway(stack, stack.gateway_urls[0], stack.gateway_procs[0].pid, token, kind=k,
                                    seconds=cfg.profile_seconds, connections=cfg.plan.connections)
                    for k in KINDS]


def measure(cfg: Config, results: dict[str, Any]) -> None:
    if {"proxy", "sse", "tokens", "profile"} & set(cfg.sections):
        measure_stack(cfg, results)
    if "redaction" in cfg.sections:
        log("3. redaction (bench/redact.py)")
        results["redaction"] = redaction(cfg)
    if "sources" in cfg.sections:
        log("8. run-scoped credential sources (bench/sources.py)")
        argv = [sys.executable, "-m", "bench.sources", *(["--smoke"] if cfg.smoke else [])]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False,  # noqa: S603
                              cwd=REPO)
        failed = f"bench/sources.py failed ({done.returncode}): {done.stderr.strip()[-400:]}"
        results["sources"] = {"output": done.stdout.strip()} if done.returncode == 0 else {"todo": failed}
        if not cfg.smoke:  # PostgreSQL, OpenBao, a broker and a Postgres gateway: not for --smoke
            log("8. per-run database leases (bench/pg_issuance.py)")
            done = subprocess.run([sys.executable, "-m", "bench.pg_issuance", "--runs", "20"],
                                  capture_output=True, text=True, timeout=1800, check=False, cwd=REPO)
            results["sources"]["pg"] = (done.stdout.strip() if done.returncode == 0 else
                                        f"TODO: bench/pg_issuance.py failed ({done.returncode}): "
                                        f"{done.stderr.strip()[-400:]}")
    if "revocation" in cfg.sections:
        results["revocation"] = []
        for n in cfg.replicas:
            log(f"5. revocation propagation, {n} replicas")
            results["revocation"].append(asyncio.run(revocation(n, cfg.trials)))
    if "egress" in cfg.sections:
        log("7. egress proxy (bench/egress.py)")
        egress.measure(cfg.egress, results, log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="seconds, tiny loads; no doc is written")
    parser.add_argument("--doc", type=Path, help="splice the tables into this Markdown file")
    parser.add_argument("--out", type=Path, help="write the generated Markdown here")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    parser.add_argument("--rounds", type=int, help="rounds of tables 1 and 7 (default 3)")
    parser.add_argument("--sections", help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--render", type=Path, help="no measuring: render results saved by --json")
    parser.add_argument("--quiet-wait", type=float, default=None, metavar="SECONDS",
                        help="first wait up to this long for other processes to leave the CPU "
                             "(default 600, 0 with --smoke)")
    args = parser.parse_args(argv)
    cfg = SMOKE if args.smoke else FULL
    if args.rounds:
        cfg = replace(cfg, plan=replace(cfg.plan, rounds=args.rounds),
                      egress=replace(cfg.egress, rounds=args.rounds))
    if args.sections:
        cfg = replace(cfg, sections=tuple(s.strip() for s in args.sections.split(",")))
    if args.render:
        results: dict[str, Any] = json.loads(args.render.read_text())
    else:
        results = {"machine": docfile.machine(), "tools": {}, "skipped": [], "smoke": cfg.smoke,
                   "command": "./scripts/bench" if not args.smoke else "python -m bench.run --smoke",
                   "gateway_before": gateway_before(args.doc or REPO / "docs" / "benchmarks.md")}
        wait = args.quiet_wait if args.quiet_wait is not None else (0.0 if cfg.smoke else 600.0)
        if wait > 0:
            results["outside_cpu_before"] = round(wait_quiet(wait, log=log), 3)
        started, outside = time.monotonic(), OutsideLoad()
        try:
            measure(cfg, results)
        except BenchFailure as exc:
            log(f"FAILED: {exc}")
            return 1
        results["elapsed_s"] = round(time.monotonic() - started, 1)
        results["outside_cpu_run"] = round(outside.share(), 3)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2, default=str))
    soak = REPO / ".bench-soak.json"  # written by ./scripts/bench soak
    if soak.exists() and not cfg.smoke:
        results["soak"] = json.loads(soak.read_text())
    markdown = report.render(results)
    if args.out:
        args.out.write_text(markdown)
    if args.doc and not args.smoke:
        docfile.splice(args.doc, "run", markdown)
    if not (args.out or args.doc):
        sys.stdout.write(markdown)
    for line in results["skipped"]:
        log(f"skipped: {line}")
    log(f"done in {results.get('elapsed_s', 0)} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
