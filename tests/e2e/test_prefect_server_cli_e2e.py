"""``nipflow prefect server``: PostgreSQL plus ``prefect server start``, stopped cleanly.

The real command in a subprocess: it creates a PostgreSQL cluster in ``<data-dir>/postgres``
(or uses ``--database-url``), starts the Prefect server on it, prints the API URL to export
and the UI URL, and on SIGTERM or Ctrl-C (SIGINT) stops the server and then PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from flows.pg_cluster import PostgresCluster, free_port
from flows.prefect_pg_server import healthy
from prefect_e2e_processes import NIPFLOW, PREFECT, clean_environ, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

READY = re.compile(r"export PREFECT_API_URL=(\S+)")
PG_URL = re.compile(r"PostgreSQL: (postgresql\+asyncpg://\S+)")


@dataclass
class CliServer:
    proc: subprocess.Popen
    log: Path
    api_url: str

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def signal_and_wait(self, sig: int, timeout: float = 60) -> int:
        os.kill(self.proc.pid, sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise AssertionError(f"nipflow prefect server still running {timeout} s after {sig!r}:\n"
                                 f"{self.output()[-3000:]}") from None


def start_cli_server(workdir: Path, *args: str, attempts: int = 5) -> CliServer:
    """``nipflow prefect server --port <free> ARGS``, ready (API URL printed) when returned.

    A port taken between its choice and the server's bind fails the command with Prefect's
    "already in use"; that is retried on another port.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    env = clean_environ() | {"PREFECT_LOGGING_LEVEL": "WARNING"}
    for attempt in range(1, attempts + 1):
        log = workdir / f"nipflow-server-{attempt}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([NIPFLOW, "prefect", "server", "--port", str(free_port()), *args],
                                    cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        server = CliServer(proc=proc, log=log, api_url="")
        found = wait_for(lambda: READY.search(server.output()) or proc.poll() is not None,
                         "nipflow prefect server to print its API URL", 180, [log], interval=0.5)
        if isinstance(found, re.Match):
            server.api_url = found.group(1)
            return server
        if "already in use" in server.output() and attempt < attempts:
            continue
        raise AssertionError(f"nipflow prefect server exited {proc.returncode}:\n{server.output()[-4000:]}")
    raise AssertionError(f"nipflow prefect server found no free port in {attempts} attempts")


def client_env(api_url: str, home: Path) -> dict[str, str]:
    return clean_environ() | {"PREFECT_API_URL": api_url, "PREFECT_HOME": str(home),
                               "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def work_pools_in_database(url: str) -> list[str]:
    import asyncpg

    async def read():
        conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            return [r["name"] for r in await conn.fetch("SELECT name FROM work_pool ORDER BY name")]
        finally:
            await conn.close()

    return asyncio.run(read())


@pytest.fixture
def data_root():
    """A directory the PostgreSQL OS user can enter (as root it is not the one running the test)."""
    path = Path(tempfile.mkdtemp(prefix="nipflow-e2e-cli-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_server_on_its_own_cluster_stops_cleanly_and_keeps_its_data(data_root, tmp_path):
    data_dir = data_root / "prefect-server"
    server = start_cli_server(tmp_path / "first", "--data-dir", str(data_dir))
    cluster = PostgresCluster(data_dir / "postgres")
    try:
        out = server.output()
        assert healthy(server.api_url)
        ui_url = server.api_url.removesuffix("/api")
        assert f"UI: {ui_url}" in out
        # the UI is told the server's real API URL (not port 4200)
        with urllib.request.urlopen(ui_url + "/ui-settings", timeout=10) as response:
            assert json.loads(response.read())["api_url"] == server.api_url
        # the server's database is the cluster's: a work pool created through the API is in it
        subprocess.run([PREFECT, "work-pool", "create", "probe-pool", "--type", "process"], check=True,
                       env=client_env(server.api_url, tmp_path / "client"), stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=120)
        (pg_url,) = PG_URL.findall(out)
        password = cluster.password()
        assert password and password not in out and pg_url.startswith("postgresql+asyncpg://postgres:***@")
        assert work_pools_in_database(pg_url.replace(":***@", f":{password}@")) == ["probe-pool"]
        assert cluster.running()
    finally:
        status = server.signal_and_wait(signal.SIGTERM)
    assert status == 0, server.output()[-3000:]
    assert "stopping the Prefect server and PostgreSQL" in server.output()
    assert not healthy(server.api_url) and not cluster.running()

    # a second start on the same directory reuses the cluster (the pool is still there);
    # Ctrl-C (SIGINT) stops it as cleanly
    again = start_cli_server(tmp_path / "second", "--data-dir", str(data_dir))
    try:
        (pg_url,) = PG_URL.findall(again.output())
        assert work_pools_in_database(pg_url.replace(":***@", f":{password}@")) == ["probe-pool"]
        assert cluster.password() == password  # the same cluster, the same password
    finally:
        status = again.signal_and_wait(signal.SIGINT)
    assert status == 0, again.output()[-3000:]
    assert not healthy(again.api_url) and not cluster.running()


def test_server_on_an_existing_database_leaves_it_running(postgres_cluster, data_root, tmp_path):
    server = start_cli_server(tmp_path, "--data-dir", str(data_root / "d"), "--database-url",
                              postgres_cluster.url())
    try:
        assert healthy(server.api_url)
        assert "PostgreSQL:" not in server.output()  # no cluster of its own
        assert not (data_root / "d" / "postgres").exists()
    finally:
        status = server.signal_and_wait(signal.SIGTERM)
    assert status == 0, server.output()[-3000:]
    assert not healthy(server.api_url)
    assert postgres_cluster.running()  # not ours to stop


def test_bad_database_url_exits_2_with_one_line(tmp_path):
    proc = subprocess.run([NIPFLOW, "prefect", "server", "--data-dir", str(tmp_path), "--database-url",
                           "sqlite+aiosqlite:///prefect.db"], env=clean_environ(), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "nipflow: error: --database-url: database URL scheme 'sqlite+aiosqlite': the Prefect server needs "
        "postgresql+asyncpg://"]


def test_a_port_taken_before_the_server_binds_it_is_retried(postgres_cluster, tmp_path, monkeypatch):
    from flows import prefect_pg_server

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        ports = iter([taken])  # the first "free" port is taken by the time the server binds it
        monkeypatch.setattr(prefect_pg_server, "free_port", lambda host: next(ports, None) or free_port(host))
        log = tmp_path / "server.log"
        server = prefect_pg_server.start_prefect_server(postgres_cluster.url(), tmp_path / "home", log=log,
                                                        env=clean_environ())
        try:
            assert healthy(server.api_url) and f":{taken}/" not in server.api_url
            assert f"Port {taken} is already in use" in log.read_text()
        finally:
            server.stop()
    assert not server.alive()
