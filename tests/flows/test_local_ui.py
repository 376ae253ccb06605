"""``nipflow ui`` on the history of a real ``nipflow run`` through Prefect, and where a run
started from another directory puts its datasets (the user cache, not ``./data``)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from flows.cli import main
from flows.pg_cluster import free_port

REPO = Path(__file__).resolve().parents[2]
TINY_GI = ["--protocol", "nip", "--dataset", "test", "--no-wandb", "--progress", "off",
           "--set", "rl.num_iterations=1", "--set", "rl.frames_per_batch=32", "--set", "rl.minibatch_size=16",
           "--set", "rl.num_epochs=1", "--set", "rl.num_test_iterations=1", "--set", "d_representation=4"]
DATASET = Path("nipflow", "data", "graph_isomorphism", "test", "raw")


def _env(tmp: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(tmp / "cache"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    for name in ("NIPFLOW_DATA_DIR", "NIPFLOW_RUNS_DIR", "PREFECT_API_URL", "PREFECT_HOME"):
        env.pop(name, None)
    return env


def _nipflow_run(tmp: Path, run_id: str, *extra: str) -> subprocess.CompletedProcess:
    cwd = tmp / "elsewhere"
    cwd.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "flows.cli", "run", "graph_isomorphism", "vanilla_ppo", "--run-id", run_id,
           "--runs-dir", str(tmp / "runs"), *TINY_GI, *extra]
    proc = subprocess.run(cmd, cwd=cwd, env=_env(tmp), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_a_direct_run_from_another_directory_caches_datasets_in_the_user_cache(tmp_path):
    _nipflow_run(tmp_path, "direct", "--direct")
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == []  # no ./data, nothing at all
    cached = tmp_path / "cache" / DATASET
    assert (cached / "train" / "data.pt").is_file() and (cached / "test" / "data.pt").is_file()


def _get(url: str, body: dict | None = None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _wait_for_line(proc: subprocess.Popen, prefix: str, timeout: float) -> str:
    """The first stdout line of ``proc`` that starts with ``prefix`` (the server it starts
    writes to the same stdout), or ``""`` if none comes within ``timeout``."""
    found: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            if line.startswith(prefix):
                found.put(line)
                return
        found.put("")  # it exited

    threading.Thread(target=read, daemon=True).start()
    try:
        return found.get(timeout=timeout)
    except queue.Empty:
        return ""


@pytest.mark.slow
def test_nipflow_ui_serves_the_history_of_a_local_run_and_stops_on_sigterm(tmp_path):
    _nipflow_run(tmp_path, "seen")  # through a temporary Prefect server: history in runs/.prefect
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert (tmp_path / "runs" / ".prefect" / "prefect.db").is_file()
    port = free_port()
    ui = subprocess.Popen([sys.executable, "-m", "flows.cli", "ui", "--runs-dir", str(tmp_path / "runs"),
                           "--port", str(port)], cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        # Ready once it has printed the UI address (it does so after its own health check);
        # a signal before that would stop it before the line exists.
        ready_line = _wait_for_line(ui, "Prefect UI:", 120)
        assert ready_line.startswith(f"Prefect UI: {base}"), (ready_line, ui.poll())
        assert ui.poll() is None, ui.communicate()[1][-3000:]
        assert _get(f"{base}/api/health") is True
        runs = _get(f"{base}/api/flow_runs/filter", {})
        main_runs = [r for r in runs if r["parameters"].get("run_id") == "seen"]
        assert [r["state_type"] for r in main_runs] == ["COMPLETED"]
        settings = _get(f"{base}/ui-settings")  # what the served UI calls
        assert settings["api_url"] == f"{base}/api"
        ui.send_signal(signal.SIGTERM)
        started = time.monotonic()
        out, err = ui.communicate(timeout=15)
        assert time.monotonic() - started < 10
    finally:
        if ui.poll() is None:
            ui.kill()
    assert ui.returncode == 0, err[-3000:]
    assert "stopping the Prefect server" in err
    with pytest.raises(OSError):
        _get(f"{base}/api/health")


def test_nipflow_ui_refuses_a_runs_dir_without_history_and_a_remote_store(tmp_path, capsys):
    assert main(["ui", "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert f"no Prefect history in {tmp_path / 'runs' / '.prefect'}" in err
    assert main(["ui", "--runs-dir", "s3://bucket/runs"]) == 2
    assert "--runs-dir s3://bucket/runs is a remote run store" in capsys.readouterr().err
    (tmp_path / "runs" / ".prefect").mkdir(parents=True)
    (tmp_path / "runs" / ".prefect" / "prefect.db").write_bytes(b"")
    with pytest.raises(SystemExit) as info:  # refused while parsing: one line naming the option
        main(["ui", "--runs-dir", str(tmp_path / "runs"), "--port", "70000"])
    assert info.value.code == 2
    assert capsys.readouterr().err == ("nipflow ui: error: argument --port: expected a port number from 1 to 65535, "
                                       "got 70000\n")
