"""A local PostgreSQL server for the prediction store: ``initdb`` and ``pg_ctl`` under ``<state>/postgres``.

It listens on loopback only and asks for a password (scram-sha-256). The password is made at ``initdb`` and kept in
a ``pgpass`` file beside the data (mode 0600) that libpq reads through ``PGPASSFILE``; it is never printed, so the
store URL printed by ``precursor store up`` carries none. PostgreSQL refuses to run as root: under root the server
runs as the ``postgres`` account that the Debian package makes, and owns its data folder.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from infra.maven_jars import MissingToolError
from infra.processes import Report, free_ports

PG_BIN_DIRS = tuple(Path(f"/usr/lib/postgresql/{v}/bin") for v in (17, 16, 15, 14))
USER = "precursor"
DATABASE = "precursor"


class PostgresServerError(RuntimeError):
    """The local PostgreSQL server could not be made, started or stopped; the text says why."""


def pg_bin_dir() -> Path:
    """Where ``initdb`` and ``pg_ctl`` are: the newest Debian PostgreSQL, else the PATH."""
    for folder in PG_BIN_DIRS:
        if (folder / "initdb").is_file():
            return folder
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise MissingToolError("PostgreSQL's initdb not found: install the server (apt-get install postgresql)")


@dataclass(frozen=True)
class ServerStatus:
    running: bool
    port: int | None
    url: str | None
    pgpass: Path
    data_dir: Path


class LocalPostgres:
    """One PostgreSQL server whose data, log, socket and password file lie under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root.absolute()
        self.data_dir = self.root / "data"
        self.pgpass = self.root / "pgpass"
        self.log = self.root / "server.log"
        self._as_root = os.geteuid() == 0

    # -- what the clients need ---------------------------------------------------------------------------------

    @property
    def port(self) -> int | None:
        conf = self.data_dir / "postgresql.auto.conf"
        if not conf.is_file():
            return None
        for line in conf.read_text().splitlines():
            if line.startswith("port = "):
                return int(line.split("=", 1)[1].strip().strip("'"))
        return None

    def url(self, database: str = DATABASE) -> str:
        """The store URL (no password: libpq takes it from :attr:`pgpass` through ``PGPASSFILE``)."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def client_env(self) -> dict[str, str]:
        return {"PGPASSFILE": str(self.pgpass)}

    def status(self) -> ServerStatus:
        running = self.data_dir.is_dir() and self._pg_ctl("status", check=False).returncode == 0
        port = self.port
        return ServerStatus(running, port, self.url() if port else None, self.pgpass, self.data_dir)

    # -- life cycle --------------------------------------------------------------------------------------------

    def up(self, *, port: int | None = None, report: Report = print) -> str:
        """Make the server (once), start it and its database; returns the store URL. Already running: just that."""
        if not (self.data_dir / "PG_VERSION").is_file():
            self._init(port or free_ports(1)[0], report)
        elif port is not None and port != self.port:
            self._set_port(port)
        if not self.status().running:
            report(f"starting PostgreSQL on 127.0.0.1:{self.port} (data {self.data_dir}, log {self.log})")
            self._pg_ctl("start", "-w", "-t", "60", "-l", str(self.log))
        self.create_database(DATABASE)
        return self.url()

    def down(self, *, report: Report = print, immediate: bool = False) -> bool:
        """Stop the server (fast shutdown: sessions are ended, committed data stays; ``immediate``: no checkpoint,
        for a throwaway server); False if none ran."""
        if not self.status().running:
            report(f"no PostgreSQL server runs from {self.data_dir}")
            return False
        self._pg_ctl("stop", "-w", "-t", "60", "-m", "immediate" if immediate else "fast")
        report(f"stopped PostgreSQL ({self.data_dir})")
        return True

    def create_database(self, name: str, *, template: str | None = None) -> str:
        """Make database ``name`` if it is missing; returns its URL."""
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True, passfile=str(self.pgpass)) as con:
            if con.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
                extra = f" TEMPLATE {template}" if template else ""
                con.execute(f'CREATE DATABASE "{name}"{extra}')
        return self.url(name)

    def _init(self, port: int, report: Report) -> None:
        bin_dir = pg_bin_dir()
        self.root.mkdir(parents=True, exist_ok=True)
        if self.data_dir.exists():
            shutil.rmtree(self.data_dir)
        password = secrets.token_urlsafe(24)
        secret = self.root / "initdb.pw"
        secret.write_text(password + "\n")
        secret.chmod(0o600)
        self.data_dir.mkdir(mode=0o700)
        self._hand_over(secret, self.data_dir)
        report(f"making a PostgreSQL server in {self.data_dir} (initdb, user {USER})")
        try:
            self._run(
                [
                    str(bin_dir / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    USER,
                    "--pwfile",
                    str(secret),
                    "--auth-host=scram-sha-256",
                    "--auth-local=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ]
            )
        finally:
            secret.unlink(missing_ok=True)
        self.pgpass.write_text(f"127.0.0.1:*:*:{USER}:{password}\n")
        self.pgpass.chmod(0o600)
        self._set_port(port)

    def _set_port(self, port: int) -> None:
        # Loopback only, the socket beside the data (not /run/postgresql, which may not exist or be writable).
        settings = {
            "port": str(port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.data_dir}'",
            "fsync": "on",
        }
        conf = self.data_dir / "postgresql.auto.conf"
        text = "".join(f"{k} = {v}\n" for k, v in settings.items())
        self._write_as_owner(conf, text)

    # -- running as the right account --------------------------------------------------------------------------

    def _owner(self) -> pwd.struct_passwd | None:
        if not self._as_root:
            return None
        try:
            return pwd.getpwnam("postgres")
        except KeyError:
            raise PostgresServerError(
                "PostgreSQL refuses to run as root and there is no 'postgres' account: install the server package "
                "(apt-get install postgresql) or run as another user"
            ) from None

    def _hand_over(self, *paths: Path) -> None:
        owner = self._owner()
        if owner is None:
            return
        for path in paths:
            os.chown(path, owner.pw_uid, owner.pw_gid)
        # The server account must be able to reach its data folder.
        for parent in self.root.parents:
            if not os.access(parent, os.X_OK) or (parent.stat().st_mode & 0o001) == 0:
                raise PostgresServerError(
                    f"{parent} is not searchable by other users, so the 'postgres' account cannot reach "
                    f"{self.data_dir}: choose a state folder under a world-searchable path"
                )

    def _write_as_owner(self, path: Path, text: str) -> None:
        path.write_text(text)
        owner = self._owner()
        if owner is not None:
            os.chown(path, owner.pw_uid, owner.pw_gid)

    def _run(self, command: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        if self._as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=self.root)
        if check and done.returncode != 0:
            raise PostgresServerError(
                f"{Path(command[command.index('--') + 1] if '--' in command else command[0]).name} failed "
                f"({done.returncode}): {(done.stdout + done.stderr).strip()[-2000:]}"
            )
        return done

    def _pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        if self._as_root and "-l" in args:
            self.log.touch()
            self._hand_over(self.log)
        return self._run([str(pg_bin_dir() / "pg_ctl"), "-D", str(self.data_dir), *args], check=check)
