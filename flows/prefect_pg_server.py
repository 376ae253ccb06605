"""``prefect server start`` on PostgreSQL, and ``nipflow prefect server``.

:func:`start_prefect_server` starts the real Prefect CLI (``python -m prefect server
start``) in its own session with the settings a multi-worker server needs:

* ``PREFECT_SERVER_DATABASE_CONNECTION_URL`` = ``postgresql+asyncpg://...`` (Prefect also
  reads the older alias ``PREFECT_API_DATABASE_CONNECTION_URL``, which is removed from the
  server's environment so that the two cannot disagree);
* ``PREFECT_HOME`` (profiles, the server's local files), ``PREFECT_SERVER_ANALYTICS_ENABLED=false``;
* ``PREFECT_SERVER_UI_API_URL`` and ``PREFECT_API_URL`` = the server's own API URL: without
  them the UI calls port 4200 whatever port the server is on (docs/architecture.md#prefect-ui-port).

It returns once ``GET /api/health`` answers (database migrations run before that), and
retries with another port when an automatically chosen one was taken in between.
:func:`serve` is ``nipflow prefect server``: a PostgreSQL cluster in ``<data-dir>/postgres``
(:mod:`flows.pg_cluster`) or an existing database (``--database-url``), the Prefect server
in the foreground, and on Ctrl-C or SIGTERM the server and then PostgreSQL are stopped.
See ``docs/deployment.md``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from flows.pg_cluster import HOST, PostgresCluster, PostgresError, free_port
from flows.signals import StopRequested, foreground_signals

SERVER_ENV_DROPPED = ("PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_UI_API_URL")
_PORT_IN_USE = "already in use"
_PORT_ATTEMPTS = 5


class PrefectServerError(RuntimeError):
    """The Prefect server could not be started (the message names why and its log)."""


def asyncpg_url(url: str) -> str:
    """``url`` with Prefect's async PostgreSQL driver.

    >>> asyncpg_url("postgresql://prefect@db:5432/prefect")
    'postgresql+asyncpg://prefect@db:5432/prefect'
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise PrefectServerError(f"database URL {redact(url)!r} has no scheme (postgresql+asyncpg://...)")
    if scheme in ("postgres", "postgresql", "postgresql+asyncpg"):
        return f"postgresql+asyncpg://{rest}"
    raise PrefectServerError(f"database URL scheme {scheme!r}: the Prefect server needs postgresql+asyncpg://")


def redact(url: str) -> str:
    """``url`` without its password, for messages.

    >>> redact("postgresql+asyncpg://u:secret@h:1/db")
    'postgresql+asyncpg://u:***@h:1/db'
    """
    scheme, sep, rest = url.partition("://")
    userinfo, at, hostpart = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{hostpart}"


def server_env(database_url: str, home: Path, api_url: str,
               base: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The environment of ``prefect server start`` for ``database_url`` and ``api_url``."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in SERVER_ENV_DROPPED}
    env.update({
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_DATABASE_CONNECTION_URL": database_url,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_API_URL": api_url,
        "PREFECT_API_URL": api_url,
    })
    return env


def healthy(api_url: str, timeout: float = 2) -> bool:
    """Whether ``GET <api_url>/health`` answers ``true``."""
    try:
        with urllib.request.urlopen(api_url + "/health", timeout=timeout) as response:
            return json.loads(response.read()) is True
    except (OSError, ValueError, urllib.error.URLError):
        return False


def _tail(path: Optional[Path], lines: int = 60) -> str:
    if path is None:
        return ""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class PrefectServer:
    """A running ``prefect server start`` (its own process group)."""

    api_url: str
    ui_url: str
    home: Path
    proc: subprocess.Popen
    log: Optional[Path] = None
    local_api_url: str = ""  # where this machine reaches it (differs from api_url for 0.0.0.0)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 30) -> Optional[int]:
        """SIGTERM the server's process group (it exits in about 3 s), SIGKILL after ``timeout``."""
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10)):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        return self.proc.poll()


def start_prefect_server(database_url: str, home: Union[str, Path], *, port: Optional[int] = None,
                         host: str = HOST, log: Optional[Path] = None, env: Optional[dict[str, str]] = None,
                         startup_timeout: float = 180) -> PrefectServer:
    """Start ``prefect server start --host HOST --port PORT`` and wait until it is healthy.

    ``port=None`` picks a free port (another one if it was taken before the server bound
    it). ``log`` receives the server's output (default: this process's stdout). ``env`` is
    the base environment (default ``os.environ``); Prefect's settings are added to it.
    """
    home = Path(home).absolute()
    home.mkdir(parents=True, exist_ok=True)
    url = asyncpg_url(database_url)
    attempts = 1 if port else _PORT_ATTEMPTS
    for attempt in range(1, attempts + 1):
        chosen = port or free_port(host)
        server = _launch(url, home, host, chosen, log, env)
        try:
            deadline = time.monotonic() + startup_timeout
            while time.monotonic() < deadline and server.alive():
                if healthy(server.local_api_url):
                    return server
                time.sleep(0.5)
        except BaseException:  # Ctrl-C or a signal while waiting: leave no server behind
            server.stop()
            raise
        exited = not server.alive()
        server.stop()
        output = _tail(log)
        if exited and _PORT_IN_USE in output and attempt < attempts:
            continue  # the free port was taken before the server bound it
        state = f"exited {server.proc.returncode}" if exited else f"was not healthy after {startup_timeout} s"
        where = f"; its output ({log}):\n{output}" if log else " (its output is above)"
        raise PrefectServerError(f"prefect server on {host}:{chosen} ({redact(url)}) {state}{where}")
    raise PrefectServerError(f"no free port for the prefect server after {attempts} attempts")


_WILDCARDS = ("0.0.0.0", "::", "")


def public_host(host: str) -> str:
    """The host name clients use for a server bound to ``host`` (a wildcard: this machine's name)."""
    return socket.getfqdn() if host in _WILDCARDS else host


def _launch(url: str, home: Path, host: str, port: int, log: Optional[Path],
            env: Optional[dict[str, str]]) -> PrefectServer:
    api_url = f"http://{public_host(host)}:{port}/api"
    cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)]
    kwargs = dict(cwd=home, env=server_env(url, home, api_url, env), stdin=subprocess.DEVNULL,
                  start_new_session=True)
    if log is None:
        proc = subprocess.Popen(cmd, **kwargs)
    else:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, **kwargs)
    local_host = HOST if host in _WILDCARDS else host
    return PrefectServer(api_url=api_url, ui_url=f"http://{public_host(host)}:{port}", home=home, proc=proc,
                         log=log, local_api_url=f"http://{local_host}:{port}/api")


def serve(data_dir: Union[str, Path], *, port: int = 4200, pg_port: Optional[int] = None,
          database_url: Optional[str] = None, host: str = HOST) -> int:
    """``nipflow prefect server``: PostgreSQL + ``prefect server start`` until Ctrl-C/SIGTERM.

    Without ``database_url`` a cluster in ``<data_dir>/postgres`` is created (or reused)
    and started on ``pg_port`` (default: a free port); Prefect's home is
    ``<data_dir>/prefect-home``. Returns the exit status (0 after Ctrl-C or SIGTERM).
    """
    data_dir = Path(data_dir).absolute()
    if database_url and pg_port:
        raise PrefectServerError("--pg-port is for the cluster nipflow starts; with --database-url it has no use")
    if database_url:
        database_url = asyncpg_url(database_url)

    cluster: Optional[PostgresCluster] = None
    server: Optional[PrefectServer] = None
    status = 0
    with foreground_signals(raise_on=(signal.SIGTERM, signal.SIGHUP)) as signals:
        try:
            if database_url is None:
                cluster = PostgresCluster(data_dir / "postgres", port=pg_port)
                cluster.start()
                database_url = cluster.url()
                print(f"PostgreSQL: {redact(database_url)} (cluster in {cluster.data_dir}, log {cluster.log})",
                      flush=True)
            server = start_prefect_server(database_url, data_dir / "prefect-home", port=port, host=host)
            print(f"\nPrefect server on PostgreSQL is ready. For clients and workers:\n"
                  f"    export PREFECT_API_URL={server.api_url}\n"
                  f"UI: {server.ui_url}\nStop with Ctrl-C (or SIGTERM).", flush=True)
            status = server.proc.wait()
            print(f"nipflow: prefect server exited with status {status}", file=sys.stderr)
        except (KeyboardInterrupt, StopRequested):
            print("\nnipflow: stopping the Prefect server and PostgreSQL", file=sys.stderr, flush=True)
        except PostgresError as e:
            raise PrefectServerError(str(e)) from e
        finally:
            signals.shield()
            try:
                if server is not None:
                    server.stop()
            finally:
                if cluster is not None:
                    cluster.stop()
    return status
