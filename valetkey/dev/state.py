"""The state directory of ``valetkey dev``: one stack per directory, and what the CLI reads from it.

A running stack holds an exclusive lock on ``DIR/dev.lock`` for its whole life, so a second stack
started over the same directory is refused instead of overwriting the first one's tokens, logs and
``run.env``. ``DIR/dev.json`` says where the stack listens; the CLI reads it when neither a flag nor
an environment variable names the broker or Redis (``find_running``). The tokens sit beside it in
files of their own (mode 0600), never in ``dev.json``.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from contract.errors import ServiceError

DEFAULT_DIR = ".valetkey-dev"
DIR_VARIABLE = "VALETKEY_DEV_DIR"
STATE_FILE = "dev.json"
LOCK_FILE = "dev.lock"
ROOT_TOKEN_FILE = "vault-root-token"  # noqa: S105 - a file name
ADMIN_TOKEN_FILE = "admin-token"  # noqa: S105 - a file name


def runtime_token_file(runtime: str) -> str:
    return f"runtime-{runtime}-token"


def state_dir(explicit: Path | None = None) -> Path:
    """``--state-dir``, else ``$VALETKEY_DEV_DIR``, else ``./.valetkey-dev``."""
    return (explicit or Path(os.environ.get(DIR_VARIABLE) or DEFAULT_DIR)).resolve()


@dataclass(frozen=True)
class DevState:
    """Where a running dev stack listens (no secrets: tokens are in their own files)."""

    pid: int
    broker_url: str
    redis_url: str
    vault_addr: str
    policy_dir: str
    gateways: dict[str, str] = field(default_factory=dict)

    def write(self, directory: Path) -> None:
        path = directory / STATE_FILE
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def read(cls, directory: Path) -> DevState | None:
        """The state of a live stack in ``directory``, or None (no file, unreadable, stack gone).

        Live means: some process holds the directory's lock (a pid could have been reused)."""
        try:
            data = json.loads((directory / STATE_FILE).read_text())
            state = cls(**data)
        except (OSError, ValueError, TypeError):
            return None
        return state if _locked(directory) else None


def _locked(directory: Path) -> bool:
    try:
        with (directory / LOCK_FILE).open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
            return False
    except OSError:
        return False


def find_running(explicit: Path | None = None) -> DevState | None:
    """The dev stack the CLI should talk to when no flag or variable says otherwise."""
    return DevState.read(state_dir(explicit))


def write_secret_file(path: Path, value: str) -> None:
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(value + "\n")


class DirLock:
    """An exclusive, non-blocking lock on ``DIR/dev.lock`` held while the stack runs."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._file: IO[str] | None = None

    def __enter__(self) -> DirLock:
        self.directory.mkdir(parents=True, exist_ok=True)
        handle = (self.directory / LOCK_FILE).open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            owner = handle.read().strip() or "another process"
            handle.close()
            raise ServiceError(
                f"a valetkey dev stack (pid {owner}) is already using {self.directory}; stop it, or "
                "give this one its own directory with --state-dir DIR (or VALETKEY_DEV_DIR)"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._file = handle
        (self.directory / STATE_FILE).unlink(missing_ok=True)  # a dead stack's addresses
        return self

    def __exit__(self, *exc: object) -> None:
        (self.directory / STATE_FILE).unlink(missing_ok=True)
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None
