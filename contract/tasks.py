"""Stopping a background task for certain.

``task.cancel()`` followed by ``await task`` can wait for ever: on Python 3.11 ``asyncio.wait_for``
(which redis-py uses for every socket write when ``socket_timeout`` is set) swallows a
cancellation that arrives in the loop iteration in which its inner operation completes, and the
task carries on as if nothing happened. ``stop_task`` cancels again until the task is done, and
gives up after ``grace`` seconds, so start-up failure and shutdown always finish.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("valetkey.tasks")
RECANCEL_EVERY = 0.05  # seconds


async def stop_task(task: asyncio.Task[Any] | None, grace: float = 5.0) -> bool:
    """Cancel ``task`` until it is done; True if it ended within ``grace`` seconds."""
    if task is None:
        return True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while not task.done():
        remaining = deadline - loop.time()
        if remaining <= 0:
            log.warning('{"event": "task_did_not_stop", "task": "%s"}', task.get_name())
            return False
        task.cancel()
        await asyncio.wait({task}, timeout=min(RECANCEL_EVERY, remaining))
    if not task.cancelled() and task.exception() is not None:
        log.warning('{"event": "task_failed", "task": "%s", "error": "%s"}', task.get_name(),
                    type(task.exception()).__name__)
    return True
