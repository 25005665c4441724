"""Where a gateway worker spends its time under load: py-spy samples the process while wrk (or
the harness's closed-loop generator) drives it, and the stacks are folded into two tables —
functions by own time and by inclusive time, as a share of all samples.

    python -m bench.profile [--kind small|medium] [--seconds 10] [--connections 32] [--top 15]

The gateway runs exactly as in the benchmark (one worker, full job). py-spy comes from PyPI
(``.venv-bench``, installed by ``./scripts/bench``) and needs ptrace (we run as root).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from bench.stack import BenchStack
from bench.tools import find_pyspy, find_wrk

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_SITE = re.compile(r".*/(site-packages|lib/python3\.\d+)/")
# frames every sample passes through (process start, CLI, the event loop): not worth a row
_PLUMBING = re.compile(r"^(<module>|_run_module_as_main|_run_code|main|Command\.|Group\.|Context\.|"
                       r"gateway_serve|asyncio_run|Server\.run|Runner\.run|BaseEventLoop\.|Handle\._run|"
                       r"ProxyHeadersMiddleware|RequestResponseCycle\.run_asgi|GatewayApp\.__call__)")


def short(frame: str, lines: bool = False) -> str:
    """``func (path/to/file.py:12)`` → ``func (file.py)``, paths cut at site-packages / repo."""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    path = _SITE.sub("", match.group("file"))
    path = path.split("/work/main/")[-1]
    where = f"{path}:{match.group('line')}" if lines and match.group("line") else path
    return f"{match.group('func')} ({where})"


def package(frame: str) -> str:
    """Where a frame's code lives: ``httpcore``, ``asyncio``, ``gateways/pipeline.py`` …"""
    match = _FRAME.match(frame)
    path = match.group("file") if match else frame
    if "/site-packages/" in path:
        return path.split("/site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if re.search(r"/lib/python3\.\d+/", path):
        rest = re.split(r"/lib/python3\.\d+/", path, maxsplit=1)[1]
        return rest.split("/", 1)[0].removesuffix(".py")
    return path.split("/work/main/")[-1] if "/" in path else path


def fold(raw: str, top: int = 15) -> dict[str, Any]:
    """Self and inclusive shares (percent of samples) by function from py-spy's raw format,
    and own time by package (where the CPU goes: server, client, Redis, our code)."""
    own: Counter[str] = Counter()
    by_package: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        raw_frames = stack.split(";")
        by_package[package(raw_frames[-1])] += n
        frames = [short(f) for f in raw_frames]
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    pct = (lambda n: round(100 * n / total, 1)) if total else (lambda n: 0.0)
    return {"samples": total,
            "self": [(f, pct(n)) for f, n in own.most_common(top)],
            "packages": [(f, pct(n)) for f, n in by_package.most_common(top)],
            "inclusive": [(f, pct(n)) for f, n in inclusive.most_common(top * 4)
                          if not _PLUMBING.match(f)][:top * 2]}


def record(pid: int, seconds: float, rate: int = 250) -> str:
    """py-spy record of ``pid`` for ``seconds`` in raw (collapsed stack) format, sampling only the
    thread holding the GIL: Python's own CPU time. Without ``--gil`` a process that was preempted
    right after waking its peer (every loopback ``send`` on a busy two-core machine) shows up as
    time spent "in" ``send``, which is waiting, not work."""
    pyspy = find_pyspy()
    if pyspy is None:
        raise RuntimeError("py-spy not found (./scripts/bench installs it into .venv-bench)")
    with tempfile.NamedTemporaryFile(suffix=".txt", delete=False) as out:
        path = Path(out.name)
    try:
        done = subprocess.run(  # noqa: S603 - our argv
            [pyspy, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
             "--rate", str(rate), "--format", "raw", "--output", str(path), "--nonblocking", "--gil"],
            capture_output=True, text=True, timeout=seconds + 60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"py-spy failed: {done.stderr[-500:]}")
        return path.read_text()
    finally:
        path.unlink(missing_ok=True)


def profile_gateway(stack: BenchStack, url: str, pid: int, token: str, *, kind: str, seconds: float,
                    connections: int, top: int = 15) -> dict[str, Any]:
    """Drive ``url`` with closed-loop load while py-spy samples ``pid``; returns folded stacks."""
    from bench.proxy import KINDS, throughput

    load: dict[str, Any] = {}

    def drive() -> None:
        load.update(throughput(find_wrk(), url, f"Bearer {token}", KINDS[kind], connections,
                               seconds + 2, stack.secret))

    thread = threading.Thread(target=drive)
    thread.start()
    try:
        threading.Event().wait(1.0)  # let the load settle before sampling
        folded = fold(record(pid, seconds), top)
    finally:
        thread.join(timeout=seconds + 120)
    return {**folded, "kind": kind, "connections": connections, "seconds": seconds,
            "rps_while_sampled": load.get("rps", 0.0)}


def markdown(result: dict[str, Any]) -> str:
    lines = [f"py-spy `--gil` (Python CPU only), {result['samples']} samples over {result['seconds']:g} s of "
             f"the `{result['kind']}` "
             f"request at {result['connections']} connections "
             f"({result['rps_while_sampled']:,.0f} req/s while sampled, slowed by the sampling).", "",
             "| own time | function |", "|---:|---|"]
    lines += [f"| {p:.1f} % | `{f}` |" for f, p in result["self"]]
    lines += ["", "| own time | package or module |", "|---:|---|"]
    lines += [f"| {p:.1f} % | `{f}` |" for f, p in result.get("packages", [])]
    lines += ["", "| inclusive | function |", "|---:|---|"]
    lines += [f"| {p:.1f} % | `{f}` |" for f, p in result["inclusive"] if not _PLUMBING.match(f)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=("small", "medium"), default="small")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    with BenchStack() as stack:
        token = stack.mint()["env"]["BENCH_TOKEN"]
        pid = stack.gateway_procs[0].pid
        result = profile_gateway(stack, stack.gateway_urls[0], pid, token, kind=args.kind,
                                 seconds=args.seconds, connections=args.connections, top=args.top)
    sys.stdout.write(markdown(result) + "\n")


if __name__ == "__main__":
    main()
