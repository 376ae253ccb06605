"""``nipflow ui``: the Prefect UI on the flow history of local runs.

``nipflow run`` without ``PREFECT_API_URL`` keeps its Prefect history (SQLite) in
``<runs_dir>/.prefect`` (:func:`flows.entry.local_prefect_home`). :func:`serve_ui` starts
``prefect server start`` on that home in the foreground, with ``PREFECT_SERVER_UI_API_URL``
and ``PREFECT_API_URL`` set to its own address: without them the served UI calls port
4200 whatever port the server listens on (docs/architecture.md#prefect-ui-port). Services (scheduler,
late runs ...) are off: the server shows the history and does not change it. Ctrl-C or
SIGTERM stops it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from flows.prefect_pg_server import PrefectServer, PrefectServerError, healthy, public_host
from flows.signals import StopRequested, foreground_signals

HISTORY_DB = "prefect.db"
#: Settings of the caller's environment that would point the server elsewhere.
DROPPED_ENV = ("PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL",
               "PREFECT_UI_API_URL", "PREFECT_PROFILES_PATH", "PREFECT_PROFILE")
_WILDCARDS = ("0.0.0.0", "::", "")


def history_home(runs_dir: str) -> Path:
    """The Prefect home of ``nipflow run`` for ``runs_dir``, which must hold a history.

    Raises
    ------
    PrefectServerError
        If ``runs_dir`` is an fsspec URL (the history is only kept for a local run store)
        or has no history (no ``<runs_dir>/.prefect/prefect.db``); the message names it.
    """
    from flows.entry import local_prefect_home
    from nip_core.runs.storage import is_url
    from nip_core.settings import ExperimentSettings

    if is_url(runs_dir):
        raise PrefectServerError(
            f"--runs-dir {runs_dir} is a remote run store: runs on it keep their Prefect history on the "
            f"Prefect server they ran against (open that server's UI, PREFECT_API_URL) or, started locally, "
            f"in ~/.nipflow/prefect; nipflow ui only serves the history of a local run store")
    home = local_prefect_home(ExperimentSettings(runs_dir=runs_dir))
    if not (home / HISTORY_DB).is_file():
        raise PrefectServerError(
            f"no Prefect history in {home} (runs dir {Path(runs_dir).absolute()}): it is written by "
            f"`nipflow run` without --direct and without PREFECT_API_URL")
    return home


def ui_env(home: Path, api_url: str, base: dict[str, str]) -> dict[str, str]:
    """The environment of ``prefect server start`` serving ``home`` at ``api_url``."""
    env = {k: v for k, v in base.items() if k not in DROPPED_ENV}
    env.update({
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_API_URL": api_url,
        "PREFECT_API_URL": api_url,
    })
    return env


def start_ui_server(home: Path, *, host: str, port: int, env: dict[str, str],
                    startup_timeout: float = 120) -> PrefectServer:
    """``prefect server start --no-services`` on ``home``; returns once it is healthy."""
    api_url = f"http://{public_host(host)}:{port}/api"
    local_host = "127.0.0.1" if host in _WILDCARDS else host
    local_api_url = f"http://{local_host}:{port}/api"
    cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port), "--no-services"]
    proc = subprocess.Popen(cmd, cwd=home, env=ui_env(home, api_url, env), stdin=subprocess.DEVNULL,
                            start_new_session=True)
    server = PrefectServer(api_url=api_url, ui_url=f"http://{public_host(host)}:{port}", home=home, proc=proc,
                           local_api_url=local_api_url)
    try:
        deadline = time.monotonic() + startup_timeout
        while time.monotonic() < deadline and server.alive():
            if healthy(local_api_url):
                return server
            time.sleep(0.3)
    except BaseException:
        server.stop()
        raise
    exited = not server.alive()
    server.stop()
    state = f"exited with status {proc.returncode}" if exited else f"was not healthy after {startup_timeout} s"
    raise PrefectServerError(f"prefect server on {host}:{port} for {home} {state} (its output is above; "
                             f"is the port taken? try --port)")


def serve_ui(runs_dir: str, *, host: str = "127.0.0.1", port: int = 4200,
             env: Optional[dict[str, str]] = None) -> int:
    """``nipflow ui``: serve the history of ``runs_dir`` until Ctrl-C or SIGTERM.

    Returns the exit status: 0 after Ctrl-C or SIGTERM, else the server's own.
    """
    if not 0 < port < 65536:
        raise PrefectServerError(f"--port must be between 1 and 65535, got {port}")
    home = history_home(runs_dir)

    server: Optional[PrefectServer] = None
    status = 0
    with foreground_signals(raise_on=(signal.SIGTERM, signal.SIGHUP)) as signals:
        try:
            print(f"nipflow ui: starting the Prefect server on the history in {home}", file=sys.stderr,
                  flush=True)
            server = start_ui_server(home, host=host, port=port, env=dict(os.environ if env is None else env))
            print(f"Prefect UI: {server.ui_url}  (API {server.api_url}; history {home})\n"
                  f"Stop with Ctrl-C (or SIGTERM).", flush=True)
            status = server.proc.wait()
            print(f"nipflow ui: the Prefect server exited with status {status}", file=sys.stderr)
        except (KeyboardInterrupt, StopRequested):
            print("\nnipflow ui: stopping the Prefect server", file=sys.stderr, flush=True)
        finally:
            signals.shield()
            if server is not None:
                server.stop()
    return status
