"""A throwaway PostgreSQL cluster for the tests and ``valetkey dev``: Debian's package, one fresh
cluster per instance (``initdb`` into a temporary directory), listening on a loopback port only.

PostgreSQL refuses to run as root. As root the cluster belongs to the ``postgres`` system user
(created by Debian's package) and both ``initdb`` and the server run as that user through
``setpriv`` (an exec, not a child shell: the server gets our signals directly); as anyone else
they run as the current user. Only password logins over TCP are configured (SCRAM-SHA-256); the
Unix socket is off, so nothing reaches it without the superuser password, which is random and
never printed.

A missing binary raises ``ServiceError``: scripts/test and ``valetkey dev`` install
``postgresql`` from Debian when ``initdb`` is missing; nothing is skipped silently.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from contract.errors import Reason, ServiceError
from valetkey.dev.services import LOOPBACK, READY_TIMEOUT, LocalService

SUPERUSER = "postgres"
SYSTEM_USER = "postgres"  # the Debian package's system user, who runs the server when we are root
SQL_TIMEOUT = 30.0


def find_postgres_bin() -> Path:
    """The directory of ``postgres``/``initdb``: Debian's newest /usr/lib/postgresql/*/bin, else
    the directory of ``initdb`` on PATH."""
    def version(path: str) -> int:
        part = Path(path).parent.name
        return int(part) if part.isdigit() else 0

    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        if (Path(candidate) / "postgres").is_file() and (Path(candidate) / "initdb").is_file():
            return Path(candidate)
    found = shutil.which("initdb")
    if found and (Path(found).resolve().parent / "postgres").is_file():
        return Path(found).resolve().parent
    raise ServiceError(
        "PostgreSQL not found (no /usr/lib/postgresql/*/bin/postgres, no initdb on PATH); "
        "install Debian's package: apt-get install -y postgresql (scripts/test does it as root)",
        Reason.DATABASE_UNAVAILABLE,
    )


def _as_owner() -> list[str]:
    """The argv prefix that runs a PostgreSQL binary as a user it accepts."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise ServiceError(f"running as root and there is no {SYSTEM_USER!r} system user to run "
                           "PostgreSQL as; install Debian's postgresql package",
                           Reason.DATABASE_UNAVAILABLE) from None
    setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"
    return [setpriv, f"--reuid={SYSTEM_USER}", f"--regid={SYSTEM_USER}", "--init-groups", "--"]


class PostgresServer(LocalService):
    """A fresh cluster: ``port``, ``superuser``, ``password`` (never in repr), ``dsn(db)``,
    ``sql(statement)``. ``stop()`` then ``start()`` keeps the data; ``close()`` removes it."""

    name = "postgres"
    reason = Reason.DATABASE_UNAVAILABLE
    keeps_data = True

    def __init__(self, bin_dir: Path | None = None, port: int | None = None,
                 ready_timeout: float = READY_TIMEOUT, ssl_files: tuple[Path, Path] | None = None) -> None:
        self.bin_dir = bin_dir or find_postgres_bin()
        super().__init__(str(self.bin_dir / "postgres"), port, ready_timeout)
        self.superuser = SUPERUSER
        self.password = secrets.token_urlsafe(24)
        self.ssl_files = ssl_files  # (certificate, key): the server also speaks TLS
        self._initialised = False

    def __repr__(self) -> str:
        return f"PostgresServer(port={self.port}, running={self.running})"

    def dsn(self, database: str = "postgres", user: str | None = None, password: str | None = None) -> str:
        return (f"host={LOOPBACK} port={self.port} dbname={database} user={user or self.superuser} "
                f"password={password or self.password} sslmode=disable connect_timeout=5")

    def start(self) -> None:
        if not self.running and not self._initialised:
            self._initdb()
        super().start()

    def _initdb(self) -> None:
        workdir = self._dir or Path(tempfile.mkdtemp(prefix="valetkey-postgres-"))
        self._dir = workdir
        pwfile = workdir / "pwfile"
        pwfile.write_text(self.password + "\n", encoding="utf-8")
        pwfile.chmod(0o600)
        if os.geteuid() == 0:
            owner = pwd.getpwnam(SYSTEM_USER)
            for path in (workdir, pwfile):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        if self.ssl_files is not None:
            for index, source in enumerate(self.ssl_files):
                target = workdir / ("server.crt", "server.key")[index]
                shutil.copyfile(source, target)
                target.chmod(0o600)
                if os.geteuid() == 0:
                    os.chown(target, pwd.getpwnam(SYSTEM_USER).pw_uid, pwd.getpwnam(SYSTEM_USER).pw_gid)
        argv = [*_as_owner(), str(self.bin_dir / "initdb"), "-D", str(workdir / "data"),
                "-U", self.superuser, "--auth=scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8",
                "--no-sync", "--no-instructions"]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=120, check=False, cwd=workdir)  # noqa: S603
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ServiceError(f"initdb failed: {type(exc).__name__}: {exc}", self.reason) from None
        finally:
            pwfile.unlink(missing_ok=True)
        if done.returncode != 0:
            tail = done.stderr.decode("utf-8", "replace")[-2000:]
            raise ServiceError(f"initdb exited with {done.returncode}: {tail}", self.reason)
        self._initialised = True

    def command(self, workdir: Path) -> list[str]:
        ssl = []
        if self.ssl_files is not None:
            ssl = ["-c", "ssl=on", "-c", f"ssl_cert_file={workdir / 'server.crt'}",
                   "-c", f"ssl_key_file={workdir / 'server.key'}"]
        return [*_as_owner(), self.binary, "-D", str(workdir / "data"), "-p", str(self.port),
                "-c", f"listen_addresses={LOOPBACK}", "-c", "unix_socket_directories=",
                "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                "-c", "shared_buffers=16MB", "-c", "max_connections=100",
                "-c", "password_encryption=scram-sha-256", *ssl]

    def environment(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if not k.startswith("PG")}

    def probe(self) -> str | None:
        try:
            self.sql("SELECT 1", timeout=3.0)
        except ServiceError as exc:
            return exc.detail.splitlines()[0][:200]
        return None

    def sql(self, statement: str, database: str = "postgres", timeout: float = SQL_TIMEOUT) -> str:
        """Run SQL as the superuser with ``psql`` (tuples only, unaligned); returns its output."""
        env = {**self.environment(), "PGPASSWORD": self.password, "PGCONNECT_TIMEOUT": "3"}
        argv = [str(self.bin_dir / "psql"), "-h", LOOPBACK, "-p", str(self.port), "-U", self.superuser,
                "-d", database, "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-c", statement]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=timeout, env=env, check=False)  # noqa: S603
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ServiceError(f"psql failed: {type(exc).__name__}", self.reason) from None
        if done.returncode != 0:
            message = done.stderr.decode("utf-8", "replace").replace(self.password, "***")
            raise ServiceError(f"psql exited with {done.returncode}: {message.strip()}", self.reason)
        return done.stdout.decode("utf-8", "replace").strip()

    def redact(self, text: str) -> str:
        return text.replace(self.password, "***")
