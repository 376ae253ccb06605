"""Fixtures of the trainer tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Bit-identical resumes are asserted on one CPU thread."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A local OpenAI-compatible server with fast fine-tune jobs, one per test module."""
    from nipflow_llm_server.testing import local_api_server

    with local_api_server(tmp_path_factory.mktemp("api"), job_time_scale=0.02) as s:
        yield s
