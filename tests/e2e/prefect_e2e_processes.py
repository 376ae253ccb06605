"""Real Prefect processes for the end-to-end tests: PostgreSQL, a server, workers, ``prefect deploy``.

Nothing here is simulated. The server is ``prefect server start`` on a free loopback port
with its own ``PREFECT_HOME`` and its database in a throwaway PostgreSQL cluster
(``flows/pg_cluster.py``, started through ``flows/prefect_pg_server.py``, the code behind
``nipflow prefect server``): on SQLite, a few workers polling at once get ``500 database
is locked`` answers. Workers are started as ``deployments/README.md`` says
(``PREFECT_FLOWS_HEARTBEAT_FREQUENCY=30 nipflow worker --pool ...``, a ``prefect worker
start`` that stops on one SIGTERM); the deployments come from ``deployments/prefect.yaml``
through ``nipflow prefect setup`` and ``prefect --no-prompt deploy --all``.

Every wait is bounded and fails with the tails of the logs involved. Every process is
started in its own session, so that it and its children can be signalled as a process
group. ``nipflow worker`` runs its Prefect worker, and a process worker its flow runs, in
*their own* sessions, so stopping or killing a worker "with its flow runs" also walks the
worker's descendants in ``/proc``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from flows.pg_cluster import PostgresCluster, free_port  # noqa: F401 - free_port is re-exported
from flows.prefect_pg_server import PrefectServer as ServerProcess
from flows.prefect_pg_server import start_prefect_server as start_server_process

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PREFECT = str(BIN / "prefect")
NIPFLOW = str(BIN / "nipflow")
PREFECT_FILE = REPO / "deployments" / "prefect.yaml"
WORKER_ONLINE_TIMEOUT_S = 60


def clean_environ() -> dict[str, str]:
    """This process's environment without any Prefect, OpenAI, nipflow or AWS setting of the caller."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PREFECT_", "OPENAI_", "NIPFLOW_", "AWS_", "FSSPEC_"))}


def _start_time(pid: int) -> Optional[str]:
    """The kernel's start time of ``pid`` (tells a process from a later one with its pid)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


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


def _signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _tail(path: Path, n: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def wait_for(predicate: Callable, what: str, timeout: float, logs: list[Path], interval: float = 1.0):
    """Poll ``predicate`` until truthy (returned); on timeout fail with the tails of ``logs``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    tails = "\n".join(f"--- {p}:\n{_tail(p, 80)}" for p in logs if p.exists())
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{tails}")


def start_postgres(prefix: str = "nipflow-e2e-pg-") -> PostgresCluster:
    """A throwaway, non-durable cluster in a new directory under the system temp dir.

    Not under pytest's ``tmp_path``: as root, PostgreSQL runs as another OS user, who
    cannot enter ``/tmp/pytest-of-root`` (mode 0700). :meth:`PostgresCluster.remove`
    deletes it.
    """
    cluster = PostgresCluster(tempfile.mkdtemp(prefix=prefix), durable=False)
    try:
        return cluster.start()
    except BaseException:
        cluster.remove()
        raise


@dataclass
class PrefectServer:
    """A running ``prefect server start`` on PostgreSQL and the environment of its clients."""

    process: ServerProcess
    database_url: str

    @property
    def api_url(self) -> str:
        return self.process.api_url

    @property
    def home(self) -> Path:
        return self.process.home

    @property
    def log(self) -> Path:
        return self.process.log

    def client_env(self, home: Optional[Path] = None, **extra: str) -> dict[str, str]:
        """Environment of a CLI, worker or test process talking to this server."""
        env = clean_environ()
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
        """SIGTERM the server's process group (it exits in about 3 s), SIGKILL after 30 s."""
        self.process.stop(timeout=30)


def start_prefect_server(base: Path, database_url: str, startup_timeout: float = 180) -> PrefectServer:
    """``prefect server start`` on ``database_url``, healthy (``/api/health``) when returned."""
    base.mkdir(parents=True, exist_ok=True)
    env = clean_environ() | {"PREFECT_LOGGING_LEVEL": "WARNING"}
    process = start_server_process(database_url, base / "server-home", log=base / "server.log", env=env,
                                   startup_timeout=startup_timeout)
    return PrefectServer(process=process, database_url=database_url)


@dataclass
class Worker:
    """A ``nipflow worker`` process (its own session; its ``prefect worker start`` child in another) and its log."""

    name: str
    proc: subprocess.Popen
    log: Path
    workdir: Path
    pool: str = "nipflow-cpu"
    killed_pids: list[int] = field(default_factory=list)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def flow_run_processes(self) -> list[int]:
        return _descendants(self.proc.pid)

    def kill(self) -> list[int]:
        """SIGKILL the worker's process group and every descendant (its flow runs).

        Returns the pids that were signalled besides the worker itself.
        """
        # Freeze first, then kill: a worker that is starting a flow-run process (its own
        # session, so outside the group) while the tree is listed must not leave that
        # process alive, as it could not on a host that died. Stopped processes spawn
        # nothing, so the listing is complete once a pass finds no new one.
        _signal_group(self.proc, signal.SIGSTOP)
        others: list[int] = []
        while True:
            new = [pid for pid in _descendants(self.proc.pid) if pid not in others]
            if not new:
                break
            for pid in new:
                _signal_pid(pid, signal.SIGSTOP)
            others += new
        _signal_group(self.proc, signal.SIGKILL)
        for pid in others:
            _signal_pid(pid, signal.SIGKILL)
        self.proc.wait(10)
        self.killed_pids = others
        return others

    def stop(self, timeout: float = 20) -> None:
        """Stop as a supervisor does: one SIGTERM (``nipflow worker`` stops its Prefect worker
        within about 8 s), SIGKILL if it is still there after ``timeout``; then SIGKILL the
        worker and flow-run processes left behind (they run in their own sessions)."""
        if not self.alive():
            return
        started = {pid: _start_time(pid) for pid in _descendants(self.proc.pid)}
        _signal_group(self.proc, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _signal_group(self.proc, signal.SIGKILL)
            self.proc.wait(10)
        for pid, start_time in started.items():
            if start_time is not None and _start_time(pid) == start_time:  # not a new process with that pid
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def online(self, api_url: str) -> bool:
        """Whether the server lists this worker as ``ONLINE`` in its pool (it heartbeats and polls)."""
        from prefect.client.orchestration import SyncPrefectClient
        from prefect.exceptions import ObjectNotFound

        try:
            with SyncPrefectClient(api_url) as client:
                workers = client.read_workers_for_work_pool(self.pool)
        except ObjectNotFound:  # the worker has not created its pool yet
            return False
        return any(w.name == self.name and str(getattr(w.status, "value", w.status)) == "ONLINE" for w in workers)


def start_worker(server: PrefectServer, workdir: Path, *, pool: str = "nipflow-cpu", name: str,
                 env: Optional[dict[str, str]] = None, limit: Optional[int] = None,
                 wait_online: bool = True) -> Worker:
    """A worker as ``deployments/README.md`` starts one: ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY=30
    nipflow worker --pool <pool>`` (``prefect worker start`` that stops on one SIGTERM), with cwd
    ``workdir`` and ``env`` added.

    ``limit`` caps the flow runs it runs at once (``--limit``). Returns once the server
    lists the worker as online (so a flow run created next is seen by its next poll);
    a worker that exits or is not online within 60 s fails with its log.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    worker_env = server.client_env(home=workdir / "prefect-home",
                                   **{"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30", **(env or {})})
    log = workdir / f"{name}.log"
    cmd = [NIPFLOW, "worker", "--pool", pool, "--name", name, "--type", "process"]
    if limit is not None:
        cmd += ["--limit", str(limit)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=workdir, env=worker_env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    worker = Worker(name=name, proc=proc, log=log, workdir=workdir, pool=pool)
    if wait_online:
        try:
            wait_for(lambda: not worker.alive() or worker.online(server.api_url), f"worker {name} to be online",
                     WORKER_ONLINE_TIMEOUT_S, [log], interval=0.5)
        except BaseException:
            worker.stop()
            raise
        if not worker.alive():
            raise AssertionError(f"worker {name} exited {proc.returncode}:\n{_tail(log)}")
    return worker


DEPLOYMENTS_README = REPO / "deployments" / "README.md"


def prefect_file_with_watcher_interval(tmp_path: Path, interval_s: int) -> Path:
    """A copy of ``deployments/prefect.yaml`` whose fine-tune watcher runs every ``interval_s`` (not 60 s)."""
    text = PREFECT_FILE.read_text()
    block = "entrypoint: flows.watcher.fine_tune_watcher"
    head, tail = text.split(block)
    schedule = "- interval: 60\n        active: true"
    assert tail.count(schedule) >= 1
    tail = tail.replace(schedule, f"- interval: {interval_s}\n        active: true", 1)
    path = tmp_path / "prefect.yaml"
    path.write_text(head + block + tail)
    return path


AUTOMATIONS_FILE = REPO / "deployments" / "automations.yaml"


def automations_with_window(tmp_path: Path, window_s: int) -> Path:
    """A copy of ``deployments/automations.yaml`` whose proactive (no-heartbeat) windows are
    ``window_s`` seconds instead of 90 (Prefect accepts 10 s and more)."""
    import yaml

    spec = yaml.safe_load(AUTOMATIONS_FILE.read_text())
    proactive = [a for a in spec["automations"] if a["trigger"]["posture"] == "Proactive"]
    assert len(proactive) == 2, [a["name"] for a in spec["automations"]]
    for automation in proactive:
        automation["trigger"]["within"] = window_s
    path = tmp_path / "automations.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def install_automations(server: PrefectServer, path: Path) -> tuple[list[str], list[str]]:
    """``flows.prefect_setup.ensure_automations(path)`` against ``server``: (created, updated)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.prefect_setup import ensure_automations

    with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
        return ensure_automations(path)


def prefect_yaml_usage_command() -> list[str]:
    """The ``prefect deployment run ...`` line of the usage comment at the top of ``deployments/prefect.yaml``."""
    import shlex

    (line,) = [line for line in PREFECT_FILE.read_text().splitlines() if line.startswith("#   prefect deployment run ")]
    return [PREFECT, *shlex.split(line[1:])[1:]]


def readme_command(deployment: str, readme: Path = DEPLOYMENTS_README) -> list[str]:
    """The ``prefect deployment run '<deployment>' ...`` command of ``deployments/README.md``,
    as the argv a shell would make of it (``prefect`` resolved to this environment's).

    The command spans the lines up to the one that closes its quotes and does not end in a
    backslash, as in a shell. Fails if the README has no such command or several.
    """
    import shlex

    lines = readme.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip().startswith(f"prefect deployment run '{deployment}'")]
    assert len(starts) == 1, f"{readme} has {len(starts)} commands for {deployment}"
    text = ""
    for line in lines[starts[0]:]:
        text += line.strip() + "\n"
        try:
            shlex.split(text.replace("\\\n", " "))
        except ValueError:  # a quote still open
            continue
        if not line.rstrip().endswith("\\"):
            break
    argv = shlex.split(text.replace("\\\n", " "))
    return [PREFECT, *argv[1:]]


def flow_run_id_of(output: str) -> Optional[str]:
    """The flow run id that ``prefect deployment run`` printed (``UUID: ...``), if any."""
    import re

    found = re.search(r"UUID:\s*([0-9a-f]{8}-[0-9a-f-]{27})", output)
    return found.group(1) if found else None


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


class Api:
    """Prefect API reads through Prefect's sync client (the test process has no profile)."""

    def __init__(self, api_url: str):
        self.api_url = api_url

    def client(self):
        from prefect.client.orchestration import SyncPrefectClient

        return SyncPrefectClient(self.api_url)

    def start(self, deployment_name: str, parameters: dict) -> str:
        with self.client() as client:
            deployment = client.read_deployment_by_name(deployment_name)
            return str(client.create_flow_run_from_deployment(deployment.id, parameters=parameters).id)

    def flow_run(self, flow_run_id):
        with self.client() as client:
            return client.read_flow_run(flow_run_id)

    def state_history(self, flow_run_id) -> list[str]:
        """``TYPE/Name`` of every state the run has been in, oldest first."""
        with self.client() as client:
            states = client.read_flow_run_states(flow_run_id)
        states.sort(key=lambda s: s.timestamp)
        return [f"{s.type.value}/{s.name}" for s in states]

    def latest_artifact(self, key: str):
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

        with self.client() as client:
            found = client.read_latest_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
        return found[0] if found else None

    def flow_runs(self, flow_name: str):
        from prefect.client.schemas.filters import FlowFilter, FlowFilterName

        with self.client() as client:
            return client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])))

    def task_runs(self, name_like: str):
        from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

        with self.client() as client:
            return client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_=name_like)))

    def block_id(self, block_type: str, name: str) -> str:
        with self.client() as client:
            return str(client.read_block_document_by_name(name, block_type_slug=block_type).id)
