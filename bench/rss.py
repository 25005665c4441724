"""Resident memory (``/proc/<pid>/status`` VmRSS) and CPU time (``/proc/<pid>/stat``) of the
stack's processes.

A gateway with ``--workers K`` is a supervisor plus K worker processes: its figure is the sum of
the workers (the supervisor, which serves nothing, is reported apart).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path


def rss_mb(pid: int) -> float:
    """VmRSS of one process in MB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return 0.0
    return 0.0


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(p) for p in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return out


def workers_of(pid: int, workers: int) -> list[int]:
    """The processes that serve: the pid itself with one worker, else its worker children."""
    if workers <= 1:
        return [pid]
    # uvicorn's supervisor also forks a resource tracker (multiprocessing): keep the busy ones
    kids = children(pid)
    return sorted(kids, key=rss_mb, reverse=True)[:workers]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time used so far by these processes."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def total_mb(pids: list[int]) -> float:
    return round(sum(rss_mb(p) for p in pids), 1)


class Sampler:
    """Samples ``total_mb(pids())`` every ``interval`` seconds in a thread; ``peak``, ``samples``."""

    def __init__(self, pids: Callable[[], list[int]], interval: float = 0.25) -> None:
        self._pids = pids
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.samples: list[tuple[float, float]] = []

    def _run(self) -> None:
        start = time.monotonic()
        while not self._stop.is_set():
            self.samples.append((time.monotonic() - start, total_mb(self._pids())))
            self._stop.wait(self._interval)

    @property
    def peak(self) -> float:
        return max((mb for _, mb in self.samples), default=0.0)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _machine_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine from the first line of /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    total = sum(fields)
    return total - fields[3] - fields[4], total


def _tree_jiffies(root: int) -> int:
    """CPU time of ``root`` and every live descendant, plus what their reaped children used."""
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += sum(int(f) for f in fields[11:15])
        stack += children(pid)
    return total


class OutsideLoad:
    """The share of this machine's CPU capacity used by processes outside the harness (other
    people's builds and tests on a shared machine) between ``start()`` and ``share()``."""

    def __init__(self) -> None:
        self.start()

    def start(self) -> None:
        self._machine = _machine_jiffies()
        self._ours = _tree_jiffies(os.getpid())

    def share(self) -> float:
        busy, total = _machine_jiffies()
        ours = _tree_jiffies(os.getpid()) - self._ours
        elapsed = total - self._machine[1]
        return max(0.0, (busy - self._machine[0] - ours) / elapsed) if elapsed > 0 else 0.0


def wait_quiet(limit: float, threshold: float = 0.15, window: float = 5.0,
               log: Callable[[str], None] = print) -> float:
    """Wait (at most ``limit`` seconds) until outside processes use under ``threshold`` of the
    machine over a ``window``; returns the last share seen."""
    deadline = time.monotonic() + limit
    while True:
        probe = OutsideLoad()
        time.sleep(window)
        share = probe.share()
        if share < threshold or time.monotonic() >= deadline:
            return share
        log(f"machine busy: other processes use {share:.0%} of its CPU; waiting")
