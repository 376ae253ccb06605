"""A throwaway PostgreSQL cluster for the Prefect server (no installation or admin needed).

Prefect's server on SQLite answers ``500 database is locked`` / ``503`` as soon as a few
workers poll it (docs/architecture.md#prefect-sqlite); PostgreSQL does not.
:class:`PostgresCluster` runs the server binaries of an installed PostgreSQL
(``initdb``, ``pg_ctl``, ``createdb``) on a directory of your choice:

* ``initdb`` with password authentication (``scram-sha-256``), listening on ``127.0.0.1``
  only (no Unix socket), database superuser ``postgres`` with a random password made at
  ``initdb`` and kept in ``<base_dir>/client-password`` (mode 0600, readable by the user
  who made the cluster alone: another user of the machine cannot connect); the cluster
  lives in ``<base_dir>/data`` and logs to ``<base_dir>/postgres.log``. A cluster made by
  an older version with ``trust`` authentication (no password file) is still used as it is;
  remove it to get a password;
* ``pg_ctl start -w`` on the given port, or on a free one (a port taken between the
  choice and the bind is retried with another one);
* ``createdb`` of the Prefect database (``prefect``) if it does not exist;
* ``pg_ctl stop -m fast`` (``-m immediate`` if that does not finish), and :meth:`remove`.

An existing cluster in ``base_dir`` is reused, so a Prefect server restarted on the same
directory keeps its flow runs. PostgreSQL refuses to run as root: as root, the server
binaries run through ``runuser -u <user> --`` as ``$NIPFLOW_PG_USER``, else the ``postgres``
OS user, else ``nobody``; ``base_dir`` is given to that user, and every directory above it
must be searchable by it (``/tmp`` is; pytest's ``/tmp/pytest-of-root`` is not). The
binaries are found through ``$NIPFLOW_PG_BIN``, then ``pg_ctl`` on ``PATH``, then the
newest ``/usr/lib/postgresql/<version>/bin`` (Debian and Ubuntu).

This module uses only the standard library; it has no Prefect and no ``nip_core`` code.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Optional, Sequence
from urllib.parse import quote

PG_BIN_ENV = "NIPFLOW_PG_BIN"
PG_USER_ENV = "NIPFLOW_PG_USER"
SUPERUSER = "postgres"
PASSWORD_FILE = "client-password"
DEFAULT_DATABASE = "prefect"
HOST = "127.0.0.1"
# TCP on the loopback address only, no Unix socket (a reused cluster is held to it too)
LISTEN = f"-c listen_addresses={HOST} -c unix_socket_directories=''"
_PORT_ATTEMPTS = 5
_BIND_FAILURE = re.compile(r"could not (bind|create listen socket)|Address already in use", re.IGNORECASE)


class PostgresError(RuntimeError):
    """PostgreSQL cannot be found, set up, started or stopped (the message says why)."""


def free_port(host: str = HOST) -> int:
    """A TCP port nobody listens on right now (it may be taken before it is used)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def find_pg_bin() -> Path:
    """The directory of the PostgreSQL server binaries (``initdb``, ``pg_ctl``, ``postgres``)."""
    candidates: list[str] = []
    if os.environ.get(PG_BIN_ENV):
        candidates.append(os.environ[PG_BIN_ENV])
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(str(Path(on_path).resolve().parent))

    def version(path: str) -> tuple[int, ...]:
        return tuple(int(p) for p in re.findall(r"\d+", Path(path).parent.name))

    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    for candidate in candidates:
        if all(os.access(Path(candidate) / exe, os.X_OK) for exe in ("initdb", "pg_ctl", "postgres")):
            return Path(candidate)
    raise PostgresError(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: looked in "
        f"${PG_BIN_ENV}, on PATH and in /usr/lib/postgresql/*/bin. Install them (Debian: "
        f"apt-get install postgresql) or set {PG_BIN_ENV} to their directory.")


def postgres_os_user() -> Optional[str]:
    """The OS user the server runs as: ``None`` (the current user) unless we are root."""
    if os.geteuid() != 0:
        return None
    names = [os.environ[PG_USER_ENV]] if os.environ.get(PG_USER_ENV) else ["postgres", "nobody"]
    for name in names:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        if entry.pw_uid == 0:
            raise PostgresError(f"{PG_USER_ENV}={name} is root; PostgreSQL refuses to run as root")
        return name
    raise PostgresError(
        f"PostgreSQL refuses to run as root and none of the OS users {', '.join(names)} exists: "
        f"create one (useradd --system nipflow-pg) and set {PG_USER_ENV} to it")


def _pg_env(password: Optional[str] = None) -> dict[str, str]:
    """This environment without the libpq variables that would redirect a client (and with
    ``PGPASSWORD`` for a client of a cluster with a password)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | {"LC_ALL": "C"}
    return env | {"PGPASSWORD": password} if password else env


class PostgresCluster:
    """One PostgreSQL cluster in ``base_dir`` serving one database on ``127.0.0.1``.

    ``port=None`` picks a free port at every start. ``durable=False`` turns off ``fsync``
    and synchronous commits: faster, and fine for a cluster that is thrown away after
    tests (a crash of the machine may lose or corrupt it). Use as a context manager to
    start and stop it, or call :meth:`start`, :meth:`stop` and :meth:`remove`.
    """

    def __init__(self, base_dir: str | Path, *, port: Optional[int] = None, database: str = DEFAULT_DATABASE,
                 durable: bool = True, bin_dir: Optional[Path] = None, os_user: Optional[str] = None):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", database):
            raise PostgresError(f"database name {database!r}: use letters, digits and '_' only")
        self.base_dir = Path(base_dir).absolute()
        self.data_dir = self.base_dir / "data"
        self.log = self.base_dir / "postgres.log"
        self.database = database
        self.durable = durable
        self.requested_port = port
        self.port: Optional[int] = None
        self.bin_dir = bin_dir or find_pg_bin()
        self.os_user = os_user if os_user is not None else postgres_os_user()

    # -- what clients need -----------------------------------------------------------------

    @property
    def password_file(self) -> Path:
        return self.base_dir / PASSWORD_FILE

    def password(self) -> Optional[str]:
        """The superuser's password (``None`` for a cluster made with ``trust`` by an older version)."""
        try:
            return self.password_file.read_text().strip()
        except FileNotFoundError:
            return None

    def url(self, driver: str = "postgresql+asyncpg") -> str:
        """The SQLAlchemy URL of the database, with the superuser's password (a secret: print
        it through ``redact``)."""
        if self.port is None:
            raise PostgresError(f"the cluster in {self.base_dir} is not running")
        password = self.password()
        user = f"{SUPERUSER}:{quote(password, safe='')}" if password else SUPERUSER
        return f"{driver}://{user}@{HOST}:{self.port}/{self.database}"

    @property
    def initialized(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def running(self) -> bool:
        return self.initialized and self._run(["pg_ctl", "-D", str(self.data_dir), "status"], check=False,
                                              as_server=True).returncode == 0

    # -- processes ------------------------------------------------------------------------

    def _run(self, args: Sequence[str], *, check: bool = True, as_server: bool = False,
             timeout: float = 120, password: Optional[str] = None) -> subprocess.CompletedProcess:
        """Run a PostgreSQL binary; server binaries as :attr:`os_user` (root is refused)."""
        cmd = [str(self.bin_dir / args[0]), *args[1:]]
        if as_server and self.os_user:
            cmd = ["runuser", "-u", self.os_user, "--", *cmd]
        try:
            proc = subprocess.run(cmd, cwd="/", env=_pg_env(password), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise PostgresError(f"{args[0]} did not finish in {timeout} s ({self.base_dir})") from e
        if check and proc.returncode != 0:
            raise PostgresError(f"{' '.join(args)} exited {proc.returncode} ({self.base_dir}):\n"
                                f"{proc.stdout.strip()[-3000:]}{self._log_tail()}")
        return proc

    def _log_tail(self, lines: int = 20) -> str:
        try:
            tail = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"\n--- {self.log}:\n" + "\n".join(tail)

    def _give_to_server_user(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if not self.os_user:
            return
        entry = pwd.getpwnam(self.os_user)
        os.chown(self.base_dir, entry.pw_uid, entry.pw_gid)
        os.chmod(self.base_dir, 0o700)
        check = subprocess.run(["runuser", "-u", self.os_user, "--", "test", "-w", str(self.base_dir)],
                               cwd="/", stdin=subprocess.DEVNULL, capture_output=True)
        if check.returncode != 0:
            raise PostgresError(
                f"PostgreSQL refuses to run as root, so it runs as OS user '{self.os_user}', who cannot "
                f"reach {self.base_dir}: choose a directory whose parents are searchable by that user "
                f"(for example under /tmp or /var/tmp), make them so (chmod o+x), or set {PG_USER_ENV}")

    def init(self) -> None:
        """``initdb`` (password auth, 127.0.0.1 only) unless ``base_dir`` already holds a cluster."""
        self._give_to_server_user()
        if self.initialized:
            return
        if self.data_dir.exists() and any(self.data_dir.iterdir()):
            raise PostgresError(f"{self.data_dir} is not empty and holds no PostgreSQL cluster")
        password = secrets.token_urlsafe(24)
        # initdb (run as the server's OS user) reads the password from a file of that user
        pwfile = self.base_dir / ".initdb-password"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(password + "\n")
            if self.os_user:
                entry = pwd.getpwnam(self.os_user)
                os.chown(pwfile, entry.pw_uid, entry.pw_gid)
            args = ["initdb", "-D", str(self.data_dir), "-U", SUPERUSER, "--auth=scram-sha-256",
                    f"--pwfile={pwfile}", "-E", "UTF8", "--locale=C"]
            if not self.durable:
                args.append("--no-sync")
            self._run(args, as_server=True)
        finally:
            pwfile.unlink(missing_ok=True)
        fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # this user's alone
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        settings = ["max_connections = 200"]  # where it listens is given at every start (LISTEN)
        if not self.durable:
            settings += ["fsync = off", "synchronous_commit = off", "full_page_writes = off"]
        with open(self.data_dir / "postgresql.conf", "a") as conf:  # stays owned by the server user
            conf.write("\n# nipflow (flows/pg_cluster.py)\n" + "\n".join(settings) + "\n")

    def start(self, timeout: float = 60) -> "PostgresCluster":
        """Initialise if needed, start (waiting until it accepts connections) and create the database."""
        if self.running():
            raise PostgresError(f"a PostgreSQL server already runs on {self.data_dir}: stop it first "
                                f"({self.bin_dir / 'pg_ctl'} -D {self.data_dir} stop)")
        self.init()
        attempts = 1 if self.requested_port else _PORT_ATTEMPTS
        for attempt in range(attempts):
            port = self.requested_port or free_port()
            proc = self._run(["pg_ctl", "-D", str(self.data_dir), "-l", str(self.log), "-w", "-t", str(int(timeout)),
                              "-o", f"-p {port} {LISTEN}", "start"], check=False, as_server=True,
                             timeout=timeout + 30)
            if proc.returncode == 0:
                self.port = port
                break
            bind_failed = _BIND_FAILURE.search(proc.stdout + self._log_tail(5))
            if not (bind_failed and attempt + 1 < attempts):
                self.stop()  # a server that came up too late for -w must not be left behind
                detail = f"port {port} is in use" if bind_failed else f"exit status {proc.returncode}"
                raise PostgresError(f"PostgreSQL did not start on {HOST}:{port} ({detail}):\n"
                                    f"{proc.stdout.strip()[-2000:]}{self._log_tail()}")
        self._create_database()
        return self

    def _create_database(self) -> None:
        proc = self._run(["createdb", "-h", HOST, "-p", str(self.port), "-U", SUPERUSER, "-w", self.database],
                         check=False, password=self.password())
        if proc.returncode != 0 and "already exists" not in proc.stdout:
            raise PostgresError(f"createdb {self.database} on port {self.port} failed: {proc.stdout.strip()}")

    def stop(self, timeout: float = 60) -> None:
        """Stop the server if it runs: fast shutdown (clients disconnected), else immediate."""
        if not self.initialized or not self.running():
            self.port = None
            return
        args = ["pg_ctl", "-D", str(self.data_dir), "-w", "-t", str(int(timeout)), "stop"]
        proc = self._run([*args, "-m", "fast"], check=False, as_server=True, timeout=timeout + 30)
        if proc.returncode != 0 and self.running():
            self._run([*args, "-m", "immediate"], as_server=True, timeout=timeout + 30)
        self.port = None

    def remove(self) -> None:
        """Stop the server and delete ``base_dir`` with everything in it."""
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> "PostgresCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

