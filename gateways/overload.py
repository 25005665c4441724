"""What a gateway process does when it runs short of file descriptors.

- At start-up the soft ``RLIMIT_NOFILE`` is raised (up to the hard limit) to fit the connection
  cap plus the upstream and Redis pools; if the hard limit is lower, ``fd_limit_low`` is logged
  once with the numbers, and the cap is the operator's to lower.
- asyncio itself backs off accepting for a second when ``accept()`` fails with EMFILE/ENFILE,
  but it reports every failed attempt with a traceback (up to the listen backlog, 2048, per
  wake-up): a descriptor shortage once wrote ~485,000 tracebacks. The loop's exception handler
  here logs each distinct message at most once per ``LOG_EVERY`` seconds, with the count of
  those it held back (``loop_error`` events, no traceback for repeats).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("valetkey.gateway")
LOG_EVERY = 10.0  # seconds between two log lines for the same repeated loop error
RESERVED_FDS = 64  # files, sockets to Vault and the broker, the metrics port, the listener


def needed_fds(max_connections: int, upstream_connections: int, redis_connections: int) -> int:
    return max_connections + upstream_connections + redis_connections + RESERVED_FDS


def raise_fd_limit(needed: int) -> tuple[int, int]:
    """Raise the soft limit toward ``needed`` (never above the hard limit); (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning('{"event": "fd_limit_low", "soft": %d, "hard": %d, "needed": %d}', soft, hard, needed)
    return soft, hard


class QuietErrors:
    """An event-loop exception handler that logs each distinct message at most once per
    ``every`` seconds; ``held`` counts the reports not logged."""

    def __init__(self, every: float = LOG_EVERY, clock: Callable[[], float] = time.monotonic) -> None:
        self._every = every
        self._clock = clock
        self._last: dict[str, tuple[float, int]] = {}
        self.held = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        key = f"{context.get('message', '')}|{type(exc).__name__ if exc else ''}|{getattr(exc, 'errno', '')}"
        now = self._clock()
        last, skipped = self._last.get(key, (float("-inf"), 0))
        if now - last < self._every:
            self._last[key] = (last, skipped + 1)
            self.held += 1
            return
        if len(self._last) > 1000:  # bounded, whatever the variety of messages
            self._last.clear()
        self._last[key] = (now, 0)
        # the type and errno only: a foreign exception's text is not ours to vouch for
        log.error('{"event": "loop_error", "message": "%s", "error": "%s", "errno": "%s", "held_back": %d}',
                  str(context.get("message", ""))[:200].replace('"', "'"),
                  type(exc).__name__ if exc else "", getattr(exc, "errno", "") or "", skipped)


def install(loop: asyncio.AbstractEventLoop, needed: int) -> QuietErrors:
    raise_fd_limit(needed)
    handler = QuietErrors()
    loop.set_exception_handler(handler)
    return handler
