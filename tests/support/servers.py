"""Run an ASGI app under a real uvicorn server on a free loopback port, in a thread."""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any

import uvicorn

from valetkey.dev.services import free_port


class ThreadedServer:
    def __init__(self, app: Any, port: int | None = None, http: Any = "h11", host: str = "127.0.0.1",
                 **options: Any) -> None:
        self.port = port or free_port()
        self.host = host
        config = uvicorn.Config(
            app, host=host, port=self.port, log_level="warning", lifespan="on",
            access_log=False, http=http, **options,
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.exit_code: int | None = None

    def _run(self) -> None:
        try:
            self.server.run()
        except SystemExit as exc:  # uvicorn exits when the app's start-up fails
            self.exit_code = int(exc.code or 0)

    @property
    def url(self) -> str:
        scheme = "https" if self.server.config.ssl_certfile else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def start(self) -> ThreadedServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if self.server.should_exit or not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> ThreadedServer:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
