"""Test helpers: a local server on a free loopback port for the duration of a block."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nipflow_llm_server.launcher import LocalApiServer


@contextmanager
def local_api_server(tmp_path: Path, **opts: Any) -> Iterator[LocalApiServer]:
    """Run a :class:`LocalApiServer` with data in ``tmp_path/api_server``.

    ``opts`` are :class:`LocalApiServer` keyword arguments (``job_time_scale``,
    ``api_key``, ``latency_ms``, ``faults``, ``engine``, ``engine_options``...). The
    server is stopped on exit.

    Examples
    --------
    >>> with local_api_server(tmp_path, job_time_scale=0.02) as server:  # doctest: +SKIP
    ...     client = server.client()
    >>> with local_api_server(tmp_path, engine="transformers",  # doctest: +SKIP
    ...                       engine_options={"device": "cpu"}) as server:
    ...     client = server.client()
    """
    data_dir = opts.pop("data_dir", None) or Path(tmp_path) / "api_server"
    server = LocalApiServer(data_dir, **opts)
    server.start()
    try:
        yield server
    finally:
        server.stop()
