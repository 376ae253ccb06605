"""Real Prefect processes for the end-to-end tests: a server, workers, ``prefect deploy``.

Nothing here is simulated: ``prefect server start`` runs on a free loopback port with its
own ``PREFECT_HOME`` (SQLite in a temporary directory), workers are ``prefect worker
start`` processes, and the deployments come from ``deployments/prefect.yaml`` through
``nipflow prefect setup`` and ``prefect --no-prompt deploy --all``.

Every process is started in its own session, so that it and its children can be
signalled as a process group. Flow runs are started by a process worker in *their own*
session (prefect_notes.md §6), so killing a worker "with its flow runs" also walks the
worker's descendants in ``/proc``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PREFECT = str(BIN / "prefect")
NIPFLOW = str(BIN / "nipflow")
PREFECT_FILE = REPO / "deployments" / "prefect.yaml"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_environ() -> dict[str, str]:
    """This process's environment without any Prefect or OpenAI setting of the caller."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PREFECT_", "OPENAI_", "NIPFLOW_"))}


def _descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (from ``/proc``; flow runs have their own session)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _tail(path: Path, n: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


@dataclass
class PrefectServer:
    """A running ``prefect server start`` and the environment of its clients."""

    api_url: str
    home: Path
    log: Path
    proc: subprocess.Popen

    def client_env(self, home: Optional[Path] = None, **extra: str) -> dict[str, str]:
        """Environment of a CLI, worker or test process talking to this server."""
        env = _clean_environ()
        env.pop("PYTHONPATH", None)  # the code comes from NIPFLOW_PROJECT_DIR, as deployed
        env.update({
            "PREFECT_API_URL": self.api_url,
            "PREFECT_HOME": str(home or self.home / "client"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "OMP_NUM_THREADS": "1",
            "WANDB_MODE": "offline",
            "WANDB_SILENT": "true",
        })
        env.update(extra)
        return env

    def cli(self, *args: str, env: Optional[dict[str, str]] = None, cwd: Path = REPO,
            timeout: float = 180, check: bool = True) -> subprocess.CompletedProcess:
        """Run a command against this server; on failure the error names its output."""
        proc = subprocess.run(list(args), cwd=cwd, env=env or self.client_env(), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-4000:]}")
        return proc

    def stop(self) -> None:
        """SIGTERM the server's process group (it exits in about 3 s), then SIGKILL."""
        if self.proc.poll() is None:
            _signal_group(self.proc, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc, signal.SIGKILL)
                self.proc.wait(10)


def start_prefect_server(base: Path, startup_timeout: float = 120) -> PrefectServer:
    base.mkdir(parents=True, exist_ok=True)
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    home = base / "server-home"
    env = _clean_environ()
    env.update({
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_API_URL": api_url,  # else the UI calls port 4200 (prefect_notes.md §8)
        "PREFECT_LOGGING_LEVEL": "WARNING",
    })
    log = base / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                cwd=base, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    server = PrefectServer(api_url=api_url, home=home, log=log, proc=proc)
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited {proc.returncode}:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(api_url + "/health", timeout=2) as response:
                if json.loads(response.read()) is True:
                    return server
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"prefect server not healthy after {startup_timeout} s:\n{_tail(log)}")


@dataclass
class Worker:
    """A ``prefect worker start`` process (its own session) and its log."""

    name: str
    proc: subprocess.Popen
    log: Path
    workdir: Path
    killed_pids: list[int] = field(default_factory=list)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def flow_run_processes(self) -> list[int]:
        return _descendants(self.proc.pid)

    def kill(self) -> list[int]:
        """SIGKILL the worker's process group and every descendant (its flow runs).

        Returns the pids that were signalled besides the worker itself.
        """
        others = _descendants(self.proc.pid)
        _signal_group(self.proc, signal.SIGKILL)
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)
        self.killed_pids = others
        return others

    def stop(self, timeout: float = 20) -> None:
        """Stop as a supervisor should: SIGTERM, then SIGINT (one signal is not enough,
        prefect_notes.md §6), then SIGKILL if it is still there."""
        if not self.alive():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            _signal_group(self.proc, sig)
            try:
                self.proc.wait(timeout / 2)
                return
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.5)
        self.kill()


def start_worker(server: PrefectServer, workdir: Path, *, pool: str = "nipflow-cpu", name: str,
                 env: Optional[dict[str, str]] = None) -> Worker:
    """``prefect worker start --pool <pool>`` with cwd ``workdir`` and ``env`` added."""
    workdir.mkdir(parents=True, exist_ok=True)
    worker_env = server.client_env(home=workdir / "prefect-home", **(env or {}))
    log = workdir / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([PREFECT, "worker", "start", "--pool", pool, "--name", name, "--type", "process"],
                                cwd=workdir, env=worker_env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    return Worker(name=name, proc=proc, log=log, workdir=workdir)


def setup_and_deploy(server: PrefectServer, prefect_file: Path = PREFECT_FILE, *,
                     env: Optional[dict[str, str]] = None) -> str:
    """``nipflow prefect setup`` then ``prefect --no-prompt deploy --all`` from the repo root.

    Returns the combined output of both commands.
    """
    env = env or server.client_env(NIPFLOW_PROJECT_DIR=str(REPO))
    out = server.cli(NIPFLOW, "prefect", "setup", "--gpus", "1", env=env).stdout
    out += server.cli(PREFECT, "--no-prompt", "deploy", "--all", "--prefect-file", str(prefect_file),
                      env=env, timeout=300).stdout
    return out


def wait_for(predicate, what: str, timeout: float, logs: list[Path], interval: float = 1.0):
    """Poll ``predicate`` until truthy (returned); on timeout fail with the tails of ``logs``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    tails = "\n".join(f"--- {p}:\n" + "\n".join(p.read_text(errors="replace").splitlines()[-80:])
                      for p in logs if p.exists())
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{tails}")
