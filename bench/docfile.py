"""docs/benchmarks.md: the machine description, and splicing generated blocks into the file.

The harness owns only what lies between its markers (``<!-- bench:NAME:begin -->`` …
``<!-- bench:NAME:end -->``); every other part of the file — the Redaction section among them —
is left as it is. A missing file is created with a ``## Redaction`` section left for its owner.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import sys
import timeit
from pathlib import Path

SKELETON = """# Benchmarks

What valetkey costs, measured on loopback, side by side with direct calls, nginx and mitmproxy
(issue 6). Every table below was produced by one command on the machine it describes:

```sh
./scripts/bench              # every table below (about 25 minutes); rewrites the generated blocks
./scripts/bench soak --minutes 10
./scripts/bench --smoke      # seconds, tiny loads: checks the harness works (tests/test_bench_smoke.py)
```

<!-- bench:run:begin -->
<!-- bench:run:end -->

<!-- bench:soak:begin -->
<!-- bench:soak:end -->

## Redaction

Redaction throughput is measured by `bench/redact.py`; its section goes here.
"""


def machine() -> dict[str, str]:
    """What the figures were measured on (``nproc``, CPU model, memory, kernel, Python)."""
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal:"))
        memory = f"{mem_kb / 1024 / 1024:.1f} GiB"
    except (OSError, StopIteration, ValueError):
        memory = "?"
    # one figure to scale by: this machine runs pure Python well below a current desktop CPU
    loop_us = min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6
    return {
        "cores": str(os.cpu_count() or "?"), "cpu": model, "memory": memory, "kernel": platform.release(),
        "python": sys.version.split()[0], "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "calibration": f"`sum(range(1000))` takes {loop_us:.1f} µs",
        "commit": _git("rev-parse", "--short", "HEAD"),
        "dirty": "yes" if _git("status", "--porcelain", "--untracked-files=no") else "no",
    }


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,  # noqa: S603, S607
                              cwd=Path(__file__).resolve().parent.parent, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip()


def splice(path: Path, name: str, block: str) -> None:
    """Replace the ``name`` block of ``path`` with ``block`` (creating the file or block if absent)."""
    begin, end = f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"
    text = path.read_text() if path.exists() else SKELETON
    if begin not in text or end not in text:
        anchor = text.find("\n## Redaction")
        insert = f"\n{begin}\n{end}\n"
        text = text[:anchor] + insert + text[anchor:] if anchor >= 0 else text.rstrip("\n") + "\n" + insert
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{head}{begin}\n{block.strip()}\n{end}{tail}")
