"""Driving `valetkey dev` from a test: its output up to the line that says it is ready."""

from __future__ import annotations

import subprocess
import time

READY = "Ctrl-C to stop"


def output_until_ready(proc: subprocess.Popen[str], seconds: float) -> str:
    """What the stack printed until it said it is ready (or stopped printing, or time ran out)."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if READY in line:
            break
    return "".join(lines)
