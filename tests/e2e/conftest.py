"""Fixtures of the end-to-end tests: a real Prefect server per module, workers per test.

The processes themselves are managed by :mod:`prefect_e2e_processes` (a module with a
unique name, so that test modules can import its helpers whatever conftest was loaded last).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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
    start_prefect_server,
    start_worker,
)


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """A real ``prefect server start`` on 127.0.0.1 for the tests of one module."""
    server = start_prefect_server(tmp_path_factory.mktemp("prefect-server"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def workers(prefect_server):
    """Start workers with ``workers.start(...)``; all still alive are stopped at the end
    (workers before the server, prefect_notes.md §6)."""

    class Workers(list[Worker]):
        def start(self, workdir: Path, **kwargs: Any) -> Worker:
            worker = start_worker(prefect_server, workdir, **kwargs)
            self.append(worker)
            return worker

    started = Workers()
    yield started
    for worker in started:
        worker.stop()
