"""``nipflow run`` of a text experiment stops the local API server it started, after a
finished run and after Ctrl-C, and leaves one that was already running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nipflow_llm_server.launcher import LocalApiServer
from nipflow_llm_server.server.cli import read_server_file
from nip_core.utils.fileio import pid_alive

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
TINY = ["rl.rollouts_per_iteration=4", "dataset_options.max_train_size=4", "dataset_options.max_test_size=2",
        "text_rl.test_scheme=last"]


def _command(runs: Path, run_id: str, iterations: int) -> list[str]:
    cmd = [sys.executable, "-m", "flows.cli", "run", "code_validation", "pure_text_ei", "--protocol", "nip",
           "--direct", "--no-wandb", "--progress", "off", "--run-id", run_id, "--runs-dir", str(runs),
           "--set", f"rl.num_iterations={iterations}"]
    for item in TINY:
        cmd += ["--set", item]
    return cmd


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "NIPFLOW_DATA_DIR": str(tmp_path / "data")}
    env.pop("OPENAI_BASE_URL", None)
    return env


def test_a_finished_run_stops_the_server_it_started_and_keeps_one_running_before(tmp_path):
    runs = tmp_path / "runs"
    llm = runs / ".llm-server"
    proc = subprocess.run(_command(runs, "done", 1), env=_env(tmp_path), cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"stopped the local API server of {llm}" in proc.stderr
    assert read_server_file(llm) is None and not (llm / "autostarted.json").exists()
    # a server that was running before the run is left running
    server = LocalApiServer(llm, detached=True).start()
    try:
        proc = subprocess.run(_command(runs, "again", 1), env=_env(tmp_path), cwd=tmp_path, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "stopped the local API server" not in proc.stderr
        assert server.running and read_server_file(llm)["pid"] == server.pid
    finally:
        server.stop()


def test_ctrl_c_stops_the_server_the_run_started(tmp_path):
    runs = tmp_path / "runs"
    llm = runs / ".llm-server"
    # 300 tiny iterations (groups below the fine-tune minimum, so no jobs: ~0.05-0.1 s each)
    # keep the run busy well past the signal, whatever the sampled texts
    proc = subprocess.Popen(_command(runs, "stopped", 300), env=_env(tmp_path), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while read_server_file(llm) is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        record = read_server_file(llm)
        assert record is not None, proc.communicate(timeout=60)[1][-3000:]
        time.sleep(2.0)  # into the run's first iteration
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (75, 130), err[-3000:]  # interrupted (or preempted at a step boundary)
    assert f"stopped the local API server of {llm}" in err
    assert not pid_alive(record["pid"]) and read_server_file(llm) is None
