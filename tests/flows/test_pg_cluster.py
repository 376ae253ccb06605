"""``flows/pg_cluster.py``: a throwaway PostgreSQL cluster (real ``initdb`` / ``pg_ctl``).

Each test starts a real server from the installed PostgreSQL binaries (about 1 s). The
cluster directories are made under the system temp dir, not pytest's ``tmp_path``: as
root the server runs as another OS user, who cannot enter ``/tmp/pytest-of-root``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from flows import pg_cluster
from flows.pg_cluster import PostgresCluster, PostgresError
from flows.prefect_pg_server import PrefectServerError, asyncpg_url, redact

pytestmark = pytest.mark.slow


@pytest.fixture
def base_dir():
    path = Path(tempfile.mkdtemp(prefix="nipflow-test-pg-"))  # given to the server's OS user as root
    yield path
    shutil.rmtree(path, ignore_errors=True)


def query(cluster: PostgresCluster, sql: str, fetch: bool = True, url: str | None = None):
    """Run ``sql`` over TCP as the cluster's superuser (with its password, from ``url()``)."""
    import asyncpg

    async def run():
        conn = await asyncpg.connect(url or cluster.url(driver="postgresql"))
        try:
            return await (conn.fetch(sql) if fetch else conn.execute(sql))
        finally:
            await conn.close()

    return asyncio.run(run())


def test_start_creates_database_and_a_restart_keeps_its_data(base_dir):
    cluster = PostgresCluster(base_dir, durable=False)
    try:
        cluster.start()
        password = cluster.password()
        assert password and len(password) >= 30
        assert cluster.url().startswith(f"postgresql+asyncpg://postgres:{password}@127.0.0.1:")
        assert cluster.url().endswith("/prefect")
        assert oct(cluster.password_file.stat().st_mode & 0o777) == "0o600"
        assert redact(cluster.url()) == cluster.url().replace(password, "***")
        query(cluster, "CREATE TABLE kept (x int); INSERT INTO kept VALUES (42)", fetch=False)
        first_port = cluster.port
        cluster.stop()
        assert not cluster.running() and cluster.port is None
        with pytest.raises(PostgresError, match="not running"):
            cluster.url()

        again = PostgresCluster(base_dir, durable=False).start()  # reuses the cluster in base_dir
        assert again.running()
        assert [r["x"] for r in query(again, "SELECT x FROM kept")] == [42]
        assert first_port is not None and again.port is not None
        assert query(again, "SHOW fsync")[0]["fsync"] == "off"  # durable=False
        with pytest.raises(PostgresError, match="already runs"):
            PostgresCluster(base_dir).start()
        again.remove()
        assert not base_dir.exists()
    finally:
        cluster.remove()


def test_password_auth_listens_on_loopback_only(base_dir):
    import asyncpg

    with PostgresCluster(base_dir, durable=False) as cluster:
        hba = [line.split() for line in (cluster.data_dir / "pg_hba.conf").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
        assert hba and {row[-1] for row in hba} == {"scram-sha-256"}
        # another user of the machine, without the password, is refused
        no_password = cluster.url(driver="postgresql").replace(f":{cluster.password()}@", "@")
        with pytest.raises((asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)):
            query(cluster, "SELECT 1", url=no_password)
        with pytest.raises(asyncpg.InvalidPasswordError):
            query(cluster, "SELECT 1", url=no_password.replace("postgres@", "postgres:guess@"))
        assert {row[3] for row in hba if row[0] == "host"} <= {"127.0.0.1/32", "::1/128"}
        # no Unix socket, TCP on the loopback address only
        settings = {r["name"]: r["setting"] for r in query(
            cluster, "SELECT name, setting FROM pg_settings WHERE name IN "
                     "('listen_addresses', 'unix_socket_directories', 'port')")}
        assert settings == {"listen_addresses": "127.0.0.1", "unix_socket_directories": "",
                            "port": str(cluster.port)}
    assert not cluster.running()


def test_requested_port_in_use_is_named(base_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cluster = PostgresCluster(base_dir, port=port, durable=False)
        try:
            with pytest.raises(PostgresError, match=f"port {port} is in use"):
                cluster.start()
            assert not cluster.running()
        finally:
            cluster.remove()


def test_a_free_port_taken_before_the_bind_is_retried(base_dir, monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        ports = iter([taken])
        real_free_port = pg_cluster.free_port
        monkeypatch.setattr(pg_cluster, "free_port", lambda: next(ports, None) or real_free_port())
        cluster = PostgresCluster(base_dir, durable=False)
        try:
            cluster.start()
            assert cluster.port not in (None, taken)
            assert query(cluster, "SELECT 1 AS one")[0]["one"] == 1
        finally:
            cluster.remove()


def test_missing_binaries_are_reported(monkeypatch, tmp_path):
    monkeypatch.setenv(pg_cluster.PG_BIN_ENV, str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(pg_cluster.glob, "glob", lambda pattern: [])
    with pytest.raises(PostgresError, match="initdb, pg_ctl, postgres.*NIPFLOW_PG_BIN"):
        pg_cluster.find_pg_bin()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the cluster to another OS user")
def test_as_root_an_unreachable_directory_is_explained():
    private = Path(tempfile.mkdtemp(prefix="nipflow-test-pg-private-"))  # 0700, root's: closed to others
    try:
        cluster = PostgresCluster(private / "cluster", durable=False)
        with pytest.raises(PostgresError, match=f"runs as OS user '{cluster.os_user}', who cannot reach"):
            cluster.start()
    finally:
        shutil.rmtree(private, ignore_errors=True)


def test_database_urls():
    assert asyncpg_url("postgres://u@h/db") == "postgresql+asyncpg://u@h/db"
    assert asyncpg_url("postgresql+asyncpg://u@h/db") == "postgresql+asyncpg://u@h/db"
    with pytest.raises(PrefectServerError, match="needs postgresql\\+asyncpg"):
        asyncpg_url("sqlite+aiosqlite:///x.db")
    assert redact("postgresql://u:pw@h:5/db") == "postgresql://u:***@h:5/db"
    assert redact("postgresql://u@h:5/db") == "postgresql://u@h:5/db"
    with pytest.raises(PostgresError, match="letters, digits"):
        PostgresCluster("/nonexistent", database="bad-name; drop")
