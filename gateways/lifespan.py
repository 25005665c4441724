"""The ASGI lifespan of a valetkey data-plane process (a gateway, the egress proxy): build the
process's state, start it, stop it at shutdown — and never let a failed or stuck start-up keep the
process from ending with its reason."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol, TypeVar

from gateways.exchange import Receive, Send

STOP_GRACE = 15.0  # seconds: a stop that takes longer is abandoned, so the process still exits


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


S = TypeVar("S", bound=Service)


async def run(receive: Receive, send: Send, build: Callable[[], S], ready: Callable[[S], None],
              failed: Callable[[str], None], log: logging.Logger) -> None:
    """Serve the lifespan protocol: ``build()`` then ``start()`` at start-up (``ready(service)``
    once started; ``failed("<code>: <detail>")`` and a failed start-up otherwise), ``stop()`` at
    shutdown, each stop bounded by ``STOP_GRACE``."""
    running: S | None = None
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            service: S | None = None
            try:
                service = build()
                await service.start()
            except Exception as exc:  # every start-up failure ends the process with its reason
                if service is not None:
                    await stop_within(service, STOP_GRACE, log)
                detail = getattr(exc, "detail", None) or str(exc) or type(exc).__name__
                failed(f"{getattr(exc, 'code', 'error')}: {detail}")
                await send({"type": "lifespan.startup.failed", "message": str(detail)})
                return
            running = service
            ready(service)
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if running is not None:
                await stop_within(running, STOP_GRACE, log)
            await send({"type": "lifespan.shutdown.complete"})
            return


async def stop_within(service: Service, grace: float, log: logging.Logger) -> None:
    """Stop, but never wait longer than ``grace``: not even a task that swallows its
    cancellation (``contract/tasks.py``) can keep a failed start-up from ending the process."""
    stopping = asyncio.ensure_future(service.stop())
    done, _ = await asyncio.wait({stopping}, timeout=grace)
    if not done:
        log.warning('{"event": "stop_abandoned", "after_s": %g}', grace)
    elif stopping.exception() is not None:
        log.warning('{"event": "stop_failed", "error": "%s"}', type(stopping.exception()).__name__)
