"""Fixtures of the end-to-end tests: per module a PostgreSQL cluster with a real Prefect
server on it (and, on request, a real S3 endpoint); workers per test.

The processes themselves are managed by :mod:`prefect_e2e_processes` and
:mod:`moto_s3_process` (modules with unique names, so that test modules can import their
helpers whatever conftest was loaded last). The server runs on PostgreSQL, not SQLite:
with several workers polling, SQLite answers ``500 database is locked``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from moto_s3_process import S3Server, start_s3_server
# Re-exported for test modules that import them from here; importing from
# prefect_e2e_processes is safer (another directory's conftest may own the name "conftest").
from prefect_e2e_processes import (  # noqa: F401
    NIPFLOW,
    PREFECT,
    PREFECT_FILE,
    REPO,
    PrefectServer,
    Worker,
    free_port,
    setup_and_deploy,
    start_postgres,
    start_prefect_server,
    start_worker,
)


@pytest.fixture(scope="module")
def postgres_cluster():
    """A throwaway PostgreSQL cluster (``flows/pg_cluster.py``) for one module; removed after."""
    cluster = start_postgres()
    try:
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture(scope="module")
def prefect_server(postgres_cluster, tmp_path_factory):
    """A real ``prefect server start`` on 127.0.0.1 and ``postgres_cluster`` for one module."""
    server = start_prefect_server(tmp_path_factory.mktemp("prefect-server"), postgres_cluster.url())
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory) -> S3Server:
    """moto's standalone S3 server on a free loopback port for one module (in memory)."""
    server = start_s3_server(tmp_path_factory.mktemp("s3-server"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def workers(prefect_server):
    """Start workers with ``workers.start(...)`` (each online when returned); all still
    alive are stopped at the end, with their flow-run processes (workers before the
    server, prefect_notes.md §6), even when the test failed."""

    class Workers(list[Worker]):
        def start(self, workdir: Path, **kwargs: Any) -> Worker:
            worker = start_worker(prefect_server, workdir, **kwargs)
            self.append(worker)
            return worker

    started = Workers()
    try:
        yield started
    finally:
        errors = []
        for worker in started:
            try:
                worker.stop()
            except Exception as e:  # noqa: BLE001 - stop the others first, then report
                errors.append(f"{worker.name}: {e!r}")
        if errors:
            raise RuntimeError("workers did not stop: " + "; ".join(errors))
