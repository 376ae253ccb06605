"""``nipflow worker`` stops on one SIGTERM, also once its Prefect server is gone.

A plain ``prefect worker start`` (3.8.8) whose server has gone was still running 30 s
after SIGTERM when this was reproduced: its graceful shutdown keeps retrying the API.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.pg_cluster import free_port
from flows.prefect_pg_server import healthy
from nip_core.utils.fileio import pid_alive

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def _stop_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


def test_worker_exits_on_sigterm_after_its_server_is_gone(tmp_path):
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "home"), "PREFECT_API_URL": api_url,
           "PREFECT_SERVER_UI_API_URL": api_url, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PYTHONPATH": str(REPO)}
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--port", str(port),
                               "--no-services"], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    worker = None
    log = tmp_path / "worker.log"
    try:
        deadline = time.monotonic() + 120
        while not healthy(api_url) and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.5)
        assert healthy(api_url), "the Prefect server did not start"
        with open(log, "wb") as out:
            worker = subprocess.Popen([sys.executable, "-m", "flows.cli", "worker", "--pool", "sigterm-pool",
                                       "--type", "process", "--name", "w1"], env=env, cwd=tmp_path,
                                      stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 90
        while b"started!" not in log.read_bytes() and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.3)
        assert b"started!" in log.read_bytes(), log.read_text(errors="replace")[-3000:]
        _stop_group(server)  # SIGKILL: the server is gone at once
        time.sleep(3.0)  # the worker notices (connection errors)
        assert worker.poll() is None
        started = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(15)
        elapsed = time.monotonic() - started
    finally:
        _stop_group(server)
        if worker is not None:
            _stop_group(worker)
    text = log.read_text(errors="replace")
    assert code == 0 and elapsed < 10, text[-3000:]
    match = re.search(r"SIGTERM: stopping the Prefect worker \(pid (\d+)\)", text)
    assert match, text[-3000:]
    assert not pid_alive(int(match.group(1)))  # the prefect worker itself is gone too
    assert re.search(r"nipflow worker: stopped \((sigint|sigint2|sigkill)\) after \d+\.\d s", text)
