"""Start the local OpenAI-compatible server as a subprocess, or reuse a running one.

A server that :func:`ensure_local_server` starts for runs is stopped when the last run
using it ends (:func:`release_local_servers`); one that was running before is left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import openai

from nip_core.utils.fileio import atomic_write_bytes, pid_alive
from nip_core.llm.client import make_openai_client
from nip_core.llm.errors import LocalServerError
from nipflow_llm_server.server.server_files import EXIT_LOCKED, SERVER_FILE, read_server_file
from nipflow_llm_server.server.config import API_KEY_ENV, ENGINE_OPTIONS
from nipflow_llm_server.server.control import terminate_pid
from nipflow_llm_server.server.faults import FaultConfig

logger = logging.getLogger(__name__)

LOG_FILE = "server.log"
_REPO_ROOT = Path(__file__).resolve().parent.parent  # holds nipflow_llm_server and nip_core


def _root(base_url: str) -> str:
    return base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url.rstrip("/")


def _healthy(base_url: str, data_dir: Path | None = None, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(_root(base_url) + "/health", timeout=timeout) as response:
            body = json.loads(response.read())
    except (OSError, ValueError):
        return False
    if body.get("status") != "ok":
        return False
    return data_dir is None or Path(body.get("data_dir", "")).resolve() == Path(data_dir).resolve()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class LocalApiServer:
    """The local server in a subprocess (a context manager).

    Parameters
    ----------
    data_dir
        Where the server keeps its database, files and models (created if needed).
    host, port
        Address to bind; ``port=None`` lets the server pick a free loopback port.
    job_time_scale
        Multiplies the pacing of fine-tuning jobs (0.02 makes a job take about 0.5 s).
    api_key
        Require this Bearer key (passed through the environment, never the command line).
    latency_ms
        Added to every chat completion.
    faults
        Fault injection config (:class:`~nipflow_llm_server.server.faults.FaultConfig`).
    max_upload_mb
        ``--max-upload-mb`` (``None``: the server's default, 512).
    detached
        Start the server in its own session so that it outlives this process.
    engine
        ``selection`` (default), ``transformers`` or ``vllm`` (``--engine``).
    engine_options
        Engine options by their :class:`~nipflow_llm_server.server.config.ServerConfig` field
        name (``base_models``, ``device``, ``full_fine_tune``, ...), passed as their flags.
    """

    def __init__(
        self,
        data_dir: Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        job_time_scale: float = 1.0,
        api_key: str | None = None,
        latency_ms: float = 0.0,
        faults: FaultConfig | dict | None = None,
        *,
        job_workers: int = 2,
        max_upload_mb: float | None = None,
        startup_timeout: float = 60.0,
        log_level: str = "warning",
        detached: bool = False,
        engine: str = "selection",
        engine_options: Mapping[str, Any] | None = None,
    ):
        self.data_dir = Path(data_dir).absolute()
        self.host = host
        self.port = port
        self.job_time_scale = job_time_scale
        self.api_key = api_key
        self.latency_ms = latency_ms
        self.faults = FaultConfig.parse(faults) if faults is not None else None
        self.job_workers = job_workers
        self.max_upload_mb = max_upload_mb
        self.startup_timeout = startup_timeout
        self.log_level = log_level
        self.detached = detached
        self.engine = engine
        self.engine_options = dict(engine_options or {})
        unknown = sorted(set(self.engine_options) - set(ENGINE_OPTIONS))
        if unknown:
            raise ValueError(f"unknown engine option(s) {', '.join(unknown)}; known: {', '.join(ENGINE_OPTIONS)}")
        self._proc: subprocess.Popen | None = None
        self._base_url: str | None = None

    # -- properties ------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://host:port/v1`` (after :meth:`start`)."""
        if self._base_url is None:
            raise LocalServerError(str(self.data_dir), "the server is not started")
        return self._base_url

    @property
    def root_url(self) -> str:
        return _root(self.base_url)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def client(self, **kwargs: Any) -> openai.OpenAI:
        """An openai client for this server (``make_openai_client`` keyword arguments)."""
        return make_openai_client(self.base_url, self.api_key, **kwargs)

    # -- life cycle ------------------------------------------------------------------------

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "nipflow_llm_server.server",
            "--host", self.host,
            "--port", str(self.port or 0),
            "--data-dir", str(self.data_dir),
            "--job-time-scale", repr(self.job_time_scale),
            "--latency-ms", repr(self.latency_ms),
            "--job-workers", str(self.job_workers),
            "--log-level", self.log_level,
        ]
        if self.max_upload_mb is not None:
            cmd += ["--max-upload-mb", repr(self.max_upload_mb)]
        if self.faults is not None:
            cmd += ["--faults", self.faults.model_dump_json()]
        cmd += ["--engine", self.engine]
        for name, value in self.engine_options.items():
            flag = ENGINE_OPTIONS[name][0]
            if isinstance(value, bool):
                cmd += [flag] if value else []
            elif isinstance(value, (list, tuple)):
                for item in value:
                    cmd += [flag, str(item)]
            else:
                cmd += [flag, str(value)]
        return cmd

    def start(self) -> "LocalApiServer":
        """Launch the server and wait until ``/health`` answers.

        Raises
        ------
        LocalServerError
            The process exited (``exit_code`` 3: another server holds the data dir) or did
            not become healthy within ``startup_timeout``.
        """
        if self.running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.pop(API_KEY_ENV, None)
        if self.api_key:
            env[API_KEY_ENV] = self.api_key
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH")) if p)
        log_path = self.data_dir / LOG_FILE
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=self.detached,
            )
        deadline = time.monotonic() + self.startup_timeout
        try:
            while time.monotonic() < deadline:
                code = self._proc.poll()
                if code is not None:
                    error = LocalServerError(str(self.data_dir), f"server exited with status {code}", _tail(log_path))
                    error.exit_code = code  # type: ignore[attr-defined]
                    self._proc = None
                    raise error
                info = read_server_file(self.data_dir)
                if info and info.get("pid") == self._proc.pid and _healthy(info["base_url"], timeout=1.0):
                    self._base_url = info["base_url"]
                    self.port = int(info["port"])
                    return self
                time.sleep(0.05)
        except BaseException:  # Ctrl-C or SIGTERM (or anything) while it starts: leave no server behind
            self.stop()
            raise
        self.kill()
        raise LocalServerError(str(self.data_dir), f"not healthy after {self.startup_timeout} s", _tail(log_path))

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (graceful: running jobs are resumed at the next start), then SIGKILL."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._forget_record()
        self._proc = None

    def _forget_record(self) -> None:
        """Remove ``server.json`` if it still names this (exited) process: stopped while it started."""
        record = read_server_file(self.data_dir)
        if record and record.get("pid") == self._proc.pid:
            (self.data_dir / SERVER_FILE).unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL the server (to test crash recovery)."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._proc = None

    def __enter__(self) -> "LocalApiServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- admin -----------------------------------------------------------------------------

    def _admin(self, method: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self.root_url + "/admin/faults", data=data, method=method)
        request.add_header("content-type", "application/json")
        if self.api_key:
            request.add_header("authorization", f"Bearer {self.api_key}")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def set_faults(self, faults: FaultConfig | dict) -> dict:
        """Replace the fault injection config (``POST /admin/faults``)."""
        return self._admin("POST", FaultConfig.parse(faults).model_dump())

    def clear_faults(self) -> dict:
        return self._admin("DELETE")

    def fault_status(self) -> dict:
        """Current config and counts of injected faults."""
        return self._admin("GET")


#: Under a server's data directory: the processes using a server that runs started.
CLIENTS_DIR = "clients"
#: Written by the process that started a server for runs: ``{"server_pid", "started_by"}``.
AUTOSTARTED_FILE = "autostarted.json"
_USE_LOCK = "clients.lock"

# Data directories this process uses through ensure_local_server, with the server it
# started itself (None: it found one running).
_in_use: dict[Path, LocalApiServer | None] = {}
_in_use_guard = threading.Lock()


@contextlib.contextmanager
def _use_lock(data_dir: Path):
    """Exclusive across processes: starting, joining and leaving a data directory's server."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / _USE_LOCK, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _client_file(data_dir: Path, pid: int) -> Path:
    return data_dir / CLIENTS_DIR / f"{pid}.pid"


def _live_clients(data_dir: Path) -> list[int]:
    """Pids of live processes using the server; files of dead ones are removed."""
    live = []
    for path in sorted((data_dir / CLIENTS_DIR).glob("*.pid")):
        try:
            pid = int(path.stem)
        except ValueError:
            continue
        if pid_alive(pid):
            live.append(pid)
        else:
            path.unlink(missing_ok=True)
    return live


def _register_use(data_dir: Path, started: LocalApiServer | None) -> None:
    path = _client_file(data_dir, os.getpid())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(os.getpid()))
    with _in_use_guard:
        if _in_use.get(data_dir) is None:
            _in_use[data_dir] = started


def _autostarted_pid(data_dir: Path) -> int | None:
    try:
        return int(json.loads((data_dir / AUTOSTARTED_FILE).read_text())["server_pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _say_stopped(data_dir: Path, pid: int) -> None:
    logger.info("stopped the local API server of %s (pid %s), started for runs", data_dir, pid)


def release_local_servers(timeout: float = 20.0) -> list[str]:
    """Leave every server this process joined through :func:`ensure_local_server`.

    A server that a run started (not one that was running before) is stopped — SIGTERM,
    then SIGKILL after ``timeout`` — once no other live process uses it; a server that
    was already running is left alone. Called at the end of ``nipflow run``/``resume``,
    where the run has ended. Never at a mere process exit: a deployed flow run that
    suspends for a fine-tune wait exits with its jobs still running on that server (and
    the watcher that resumes it uses it too), so stopping it there would lose the jobs.
    Returns the data directories whose server was stopped.
    """
    with _in_use_guard:
        items = list(_in_use.items())
        _in_use.clear()
    stopped = []
    for data_dir, started in items:
        with _use_lock(data_dir):
            _client_file(data_dir, os.getpid()).unlink(missing_ok=True)
            record = read_server_file(data_dir) or {}
            server_pid = int(record.get("pid", -1))
            ours = started is not None and started.pid == server_pid
            if _autostarted_pid(data_dir) != server_pid and not ours:
                continue  # running before any run used it: not ours to stop
            if _live_clients(data_dir):
                continue  # another run still uses it: the last one stops it
            if ours:
                started.stop(timeout)
            elif pid_alive(server_pid):
                terminate_pid(server_pid, timeout)
            (data_dir / AUTOSTARTED_FILE).unlink(missing_ok=True)
            _say_stopped(data_dir, server_pid)
            stopped.append(str(data_dir))
    return stopped


def ensure_local_server(
    data_dir: Path,
    *,
    host: str = "127.0.0.1",
    job_time_scale: float = 1.0,
    api_key: str | None = None,
    startup_timeout: float = 60.0,
) -> str:
    """Base URL of a local server for ``data_dir``: the running one, else a new detached one.

    A server records ``server.json`` (pid, port) in its data directory; if that process
    is alive and its ``/health`` names the same directory it is reused. Otherwise a
    server is started in its own session (so that Ctrl-C of the run does not hit it) and
    marked as started for runs (``autostarted.json``). Every process that calls this is
    recorded as a user (``clients/<pid>.pid``) until :func:`release_local_servers`
    (called at the end of ``nipflow run``/``resume``; a deployed flow run that suspends
    leaves it running): the last user of a server that a run started stops it; a server that was running before is left alone (stop it with
    ``nipflow api-server stop``). Starting and joining happen under a lock of the
    directory, so two callers racing share one server.
    """
    data_dir = Path(data_dir).absolute()

    def running() -> str | None:
        info = read_server_file(data_dir)
        if info and pid_alive(int(info.get("pid", -1))) and _healthy(info["base_url"], data_dir):
            return info["base_url"]
        return None

    with _use_lock(data_dir):
        found = running()
        if found:
            _register_use(data_dir, None)
            return found
        server = LocalApiServer(
            data_dir, host=host, job_time_scale=job_time_scale, api_key=api_key,
            startup_timeout=startup_timeout, detached=True,
        )
        try:
            url = server.start().base_url
            atomic_write_bytes(data_dir / AUTOSTARTED_FILE,
                               json.dumps({"server_pid": server.pid, "started_by": os.getpid()}).encode("utf-8"))
            _register_use(data_dir, server)
            return url
        except LocalServerError as exc:
            if getattr(exc, "exit_code", None) != EXIT_LOCKED:
                raise
        except BaseException:  # stopped (Ctrl-C, SIGTERM) before the server was recorded as ours: stop it
            if not _in_use.get(data_dir):
                pid = server.pid
                server.stop()
                (data_dir / AUTOSTARTED_FILE).unlink(missing_ok=True)
                _client_file(data_dir, os.getpid()).unlink(missing_ok=True)
                if pid is not None:  # it had started: say so, as release_local_servers does
                    _say_stopped(data_dir, pid)
            raise
        # a server started outside this lock (nipflow api-server) holds the directory
        deadline = time.monotonic() + startup_timeout
        while time.monotonic() < deadline:
            found = running()
            if found:
                _register_use(data_dir, None)
                return found
            time.sleep(0.1)
    raise LocalServerError(str(data_dir), "another server holds the data directory but does not answer")
