"""Run the demo upstreams on loopback, each under uvicorn in a background thread.

    ports = allocate_ports()                          # pick ports first: the policies name them
    write_demo_policies(policy_dir, ports)
    vault = DevVault.create(...)                      # seeds the secrets the upstreams must accept
    with start_demo_upstreams(vault.secrets, workdir, ports) as demo:
        demo.urls["github"], demo.seen["github"][-1].header("authorization")
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

import uvicorn

from contract.errors import ServiceError
from valetkey.dev.demo.anthropic_like import AnthropicLike
from valetkey.dev.demo.common import DemoUpstream, Seen
from valetkey.dev.demo.git_http import GitHttp, create_bare_repo
from valetkey.dev.demo.github_like import DEMO_OWNER, DEMO_REPO, GitHubLike
from valetkey.dev.demo.openai_like import OpenAILike
from valetkey.dev.demo.policies import DEMO_UPSTREAMS
from valetkey.dev.services import LOOPBACK, free_port

START_TIMEOUT = 10.0


class BackgroundServer:
    """One ASGI app under uvicorn on ``LOOPBACK:port``, served from a daemon thread."""

    def __init__(self, name: str, app: DemoUpstream, port: int) -> None:
        self.name = name
        self.port = port
        config = uvicorn.Config(app, host=LOOPBACK, port=port, log_level="warning", access_log=False,
                                lifespan="off", server_header=False)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"demo-{name}", daemon=True)
        self._failed: BaseException | None = None

    def _run(self) -> None:
        try:
            self.server.run()
        except BaseException as exc:  # uvicorn exits with SystemExit when it cannot bind
            self._failed = exc

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not self.server.started:
            if not self._thread.is_alive() or self._failed is not None or time.monotonic() > deadline:
                raise ServiceError(f"demo upstream {self.name} did not start on {LOOPBACK}:{self.port} "
                                   "(port taken?)")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)


@dataclass
class DemoUpstreams:
    """The running demo upstreams: ``ports``/``urls`` by upstream name, ``seen`` (what each one
    received, in order), ``git_root`` (the bare repositories served over git smart-HTTP)."""

    apps: dict[str, DemoUpstream]
    git_root: Path
    servers: dict[str, BackgroundServer] = field(default_factory=dict)

    @property
    def ports(self) -> dict[str, int]:
        return {name: server.port for name, server in self.servers.items()}

    @property
    def urls(self) -> dict[str, str]:
        return {name: server.url for name, server in self.servers.items()}

    @property
    def seen(self) -> dict[str, list[Seen]]:
        return {name: app.seen for name, app in self.apps.items()}

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def allocate_ports(upstreams: tuple[str, ...] = DEMO_UPSTREAMS) -> dict[str, int]:
    """A free loopback port for each demo upstream."""
    return {name: free_port() for name in upstreams}


def build_app(name: str, secret: str, workdir: Path) -> DemoUpstream:
    if name == "openai":
        return OpenAILike(secret)
    if name == "anthropic":
        return AnthropicLike(secret)
    if name == "github":
        return GitHubLike(secret)
    if name == "github-git":
        root = workdir / "git"
        if not (root / DEMO_OWNER / f"{DEMO_REPO}.git").is_dir():
            create_bare_repo(root, DEMO_OWNER, DEMO_REPO)
        return GitHttp(secret, root)
    raise ServiceError(f"no demo upstream named {name!r}; known: {list(DEMO_UPSTREAMS)}")


def start_demo_upstreams(secrets: Mapping[str, str], workdir: Path,
                         ports: Mapping[str, int] | None = None) -> DemoUpstreams:
    """Start a demo upstream for each demo name in ``secrets`` (upstream name → the one secret it
    accepts; other names are ignored, as ``DevVault.secrets`` holds every upstream of its policy
    set), on ``ports[name]`` or a free port. ``workdir`` holds the git repositories. Everything
    started is stopped again if one fails to start."""
    workdir.mkdir(parents=True, exist_ok=True)
    apps = {name: build_app(name, secret, workdir)
            for name, secret in secrets.items() if name in DEMO_UPSTREAMS}
    demo = DemoUpstreams(apps, workdir / "git")
    try:
        for name, app in demo.apps.items():
            server = BackgroundServer(name, app, (ports or {}).get(name) or free_port())
            demo.servers[name] = server
            server.start()
    except BaseException:
        demo.stop()
        raise
    return demo
