"""Fixtures of the engine tests: one transformers-engine server (``nipflow-tiny-lm`` on CPU)
per test module, and its client."""

from __future__ import annotations

import pytest

from nipflow_llm_server.testing import local_api_server

FAST_JOBS = 0.02  # job_time_scale: the job phases take about half a second plus the training


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    """``nipflow api-server --engine transformers --device cpu`` shared by a module."""
    with local_api_server(tmp_path_factory.mktemp("tiny"), job_time_scale=FAST_JOBS, engine="transformers",
                          engine_options={"device": "cpu"}, startup_timeout=120.0) as server:
        yield server


@pytest.fixture(scope="module")
def tiny_client(tiny_server):
    return tiny_server.client(max_retries=2, timeout=120.0)
