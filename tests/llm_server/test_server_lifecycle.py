"""Life cycle of the local API server: started for runs and stopped by the last run using
it, left alone when it was running before, and ``nipflow api-server stop``."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nipflow_llm_server import launcher
from nipflow_llm_server.launcher import AUTOSTARTED_FILE, LocalApiServer, ensure_local_server, release_local_servers
from nipflow_llm_server.server.cli import main as api_main
from nipflow_llm_server.server.cli import read_server_file
from nipflow_llm_server.server.control import terminate_pid
from nip_core.utils.fileio import pid_alive

REPO = Path(__file__).resolve().parents[3]


def _wait_dead(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not pid_alive(pid)


@pytest.fixture(autouse=True)
def _no_leftover_use():
    yield
    release_local_servers()


def test_a_server_started_for_a_run_is_stopped_when_the_run_releases_it(tmp_path):
    data = tmp_path / "llm"
    url = ensure_local_server(data, job_time_scale=0.02)
    pid = read_server_file(data)["pid"]
    assert url == read_server_file(data)["base_url"]
    assert (data / AUTOSTARTED_FILE).is_file()
    assert sorted(p.name for p in (data / "clients").iterdir()) == [f"{os.getpid()}.pid"]
    assert ensure_local_server(data) == url  # joining again changes nothing
    assert release_local_servers() == [str(data.absolute())]
    assert _wait_dead(pid, 1.0)
    assert read_server_file(data) is None and not (data / AUTOSTARTED_FILE).exists()
    assert list((data / "clients").iterdir()) == []
    assert release_local_servers() == []  # nothing left to release


def test_a_server_running_before_the_run_is_left_running(tmp_path):
    data = tmp_path / "llm"
    server = LocalApiServer(data, job_time_scale=0.02, detached=True).start()
    try:
        assert ensure_local_server(data) == server.base_url
        assert not (data / AUTOSTARTED_FILE).exists()
        assert release_local_servers() == []
        assert server.running and read_server_file(data)["pid"] == server.pid
    finally:
        server.stop()


JOINER = """
import sys
from pathlib import Path
from nipflow_llm_server.launcher import ensure_local_server, release_local_servers
print(ensure_local_server(Path(sys.argv[1])), flush=True)
sys.stdin.readline()   # the run ends when stdin closes: release, as nipflow run does
release_local_servers()
"""


def test_the_last_process_using_a_started_server_stops_it(tmp_path):
    data = tmp_path / "llm"
    url = ensure_local_server(data, job_time_scale=0.02)
    pid = read_server_file(data)["pid"]
    other = subprocess.Popen([sys.executable, "-c", JOINER, str(data)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert other.stdout.readline().strip() == url  # joined, not a second server
        assert release_local_servers() == []  # the other process still uses it
        assert pid_alive(pid)
        other.stdin.close()
        assert other.wait(30) == 0
        assert _wait_dead(pid, 20.0)  # the last user stopped it when its run ended
        assert read_server_file(data) is None and not (data / AUTOSTARTED_FILE).exists()
    finally:
        if other.poll() is None:
            other.kill()
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_an_interrupt_while_the_server_starts_leaves_no_server_behind(tmp_path, monkeypatch):
    # Ctrl-C (or SIGTERM handled like it) while ensure_local_server waits for the new server
    data = tmp_path / "llm"
    started = []

    def interrupted_health_check(*args, **kwargs):
        started.append(read_server_file(data)["pid"])  # the server is up and has recorded itself
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher, "_healthy", interrupted_health_check)
    with pytest.raises(KeyboardInterrupt):
        ensure_local_server(data, job_time_scale=0.02)
    assert started and _wait_dead(started[0], timeout=5)  # stopped, not left detached
    assert read_server_file(data) is None and not (data / AUTOSTARTED_FILE).exists()
    assert release_local_servers() == []  # nothing recorded as in use


def test_an_interrupt_after_autostarted_is_written_stops_the_server_and_says_so(tmp_path, monkeypatch, caplog):
    # The window a signal can hit: autostarted.json is written, the use not yet recorded.
    # The run's output must read as when release_local_servers stops it (the CLI tests wait
    # for autostarted.json and then send the signal).
    data = tmp_path / "llm"
    seen = []

    def interrupted_registration(data_dir, started):
        seen.append((started.pid, (data_dir / AUTOSTARTED_FILE).exists()))
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher, "_register_use", interrupted_registration)
    with caplog.at_level(logging.INFO, logger=launcher.logger.name), pytest.raises(KeyboardInterrupt):
        ensure_local_server(data, job_time_scale=0.02)
    [(pid, autostarted)] = seen
    assert autostarted and _wait_dead(pid, timeout=5)
    assert read_server_file(data) is None and not (data / AUTOSTARTED_FILE).exists()
    assert f"stopped the local API server of {data.absolute()} (pid {pid}), started for runs" in caplog.messages
    assert release_local_servers() == []


def test_api_server_stop_by_data_dir_and_by_port(tmp_path, capsys):
    first = LocalApiServer(tmp_path / "a", job_time_scale=0.02, detached=True).start()
    second = LocalApiServer(tmp_path / "b", job_time_scale=0.02, detached=True).start()
    try:
        assert api_main(["stop", "--data-dir", str(tmp_path / "a")]) == 0
        out = capsys.readouterr().out
        assert f"stopped: pid {first.pid}, {first.base_url}" in out
        # graceful: it removed its record on the way out (uvicorn re-raises the SIGTERM)
        assert first._proc.wait(5) == -signal.SIGTERM and read_server_file(tmp_path / "a") is None
        assert api_main(["stop", "--port", str(second.port)]) == 0
        assert f"stopped: pid {second.pid}, {second.base_url}" in capsys.readouterr().out
        assert second._proc.wait(5) == -signal.SIGTERM and read_server_file(tmp_path / "b") is None
        # nothing runs: exit 0 and say so
        assert api_main(["stop", "--data-dir", str(tmp_path / "a")]) == 0
        assert "nothing stopped" in capsys.readouterr().out
        assert api_main(["stop", "--port", str(second.port)]) == 0
        assert "nothing stopped" in capsys.readouterr().out
    finally:
        first.stop()
        second.stop()


def test_api_server_stop_refuses_both_locations_and_a_bad_timeout(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        api_main(["stop", "--data-dir", str(tmp_path), "--port", "8765"])
    assert info.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    assert api_main(["stop", "--timeout", "0"]) == 2
    assert "--timeout must be positive" in capsys.readouterr().err


def test_terminate_pid_kills_a_process_that_ignores_sigterm():
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                 "print('ready', flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert stubborn.stdout.readline().strip() == "ready"
        started = time.monotonic()
        # the child of this process stays a zombie until waited: reap it in the background
        reaper = launcher.threading.Thread(target=stubborn.wait, daemon=True)
        reaper.start()
        assert terminate_pid(stubborn.pid, timeout=0.5) == "sigkill"
        assert time.monotonic() - started < 5
        reaper.join(5)
        assert stubborn.returncode == -signal.SIGKILL
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
    assert terminate_pid(stubborn.pid) == "gone"
