"""Fixtures of the llm tests: one local API server per test module and its client."""

from __future__ import annotations

import pytest

from nipflow_llm_server.testing import local_api_server

FAST_JOBS = 0.02  # job_time_scale: a job takes about half a second plus its training


@pytest.fixture(scope="module")
def api_server(tmp_path_factory):
    """A server shared by the tests of a module (fast job pacing)."""
    with local_api_server(tmp_path_factory.mktemp("api"), job_time_scale=FAST_JOBS) as server:
        yield server


@pytest.fixture(scope="module")
def client(api_server):
    return api_server.client(max_retries=2, timeout=30.0)
