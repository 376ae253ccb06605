"""One Prefect test server for all flow tests of a pytest process (about 11 s to start).

Heartbeats are off (they add about 1 s to every flow run); everything else is Prefect's
real engine against a temporary SQLite server.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        PREFECT_LOGGING_LEVEL,
        PREFECT_RESULTS_LOCAL_STORAGE_PATH,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        with temporary_settings(updates={
            PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None,
            PREFECT_SERVER_ANALYTICS_ENABLED: False,
            PREFECT_LOGGING_LEVEL: "WARNING",
            PREFECT_RESULTS_LOCAL_STORAGE_PATH: str(tmp_path_factory.mktemp("prefect-results")),
        }):
            yield PREFECT_API_URL.value()


@pytest.fixture
def fake_trainers():
    """The fake trainers registered as ``pure_text_ei`` / ``vanilla_ppo`` (no server)."""
    import torch

    torch.set_num_threads(1)
    import nipflow_fakes

    previous = nipflow_fakes.install()
    yield nipflow_fakes
    nipflow_fakes.uninstall(previous)


@pytest.fixture
def fakes(prefect_server, fake_trainers):
    """The fake trainers, with the session's Prefect test server running."""
    return fake_trainers


@pytest.fixture
def subprocess_env(prefect_server, tmp_path):
    """Environment for a child process that uses the test server."""
    env = dict(os.environ)
    env.update({
        "PREFECT_API_URL": prefect_server,
        "PREFECT_HOME": str(tmp_path / "child-prefect-home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE)]),
        "OMP_NUM_THREADS": "1",
    })
    return env


