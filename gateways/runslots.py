"""How many requests of one run are in flight at once in this gateway process.

A run at its upstream's ``run_limits.concurrent`` (default 64) is refused at once with 429
``run_concurrency_exceeded`` and ``Retry-After: 1``: one run's slow requests cannot hold every
upstream connection while the other runs wait for one. The count is per gateway process (in
memory, no Redis round trip); N replicas let a run have up to N times the limit in flight.
"""

from __future__ import annotations

from collections.abc import Callable

from contract.errors import Reason, TooManyRequests


class RunSlots:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[str, int] = {}

    def in_flight(self, run: str) -> int:
        return self._held.get(run, 0)

    def acquire(self, run: str) -> Callable[[], None]:
        """Take one of ``run``'s slots or raise 429; returns the release call (idempotent)."""
        held = self._held.get(run, 0)
        if held >= self.limit:
            error = TooManyRequests(
                f"this run already has {held} requests in flight at this gateway (its limit); "
                "retry when one has finished", Reason.RUN_CONCURRENCY_EXCEEDED)
            error.headers = {"retry-after": "1"}
            raise error
        self._held[run] = held + 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            left = self._held[run] - 1
            if left:
                self._held[run] = left
            else:
                del self._held[run]

        return release
