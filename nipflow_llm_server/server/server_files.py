"""Where a local API server records itself: the data directory's ``server.json`` and lock.

Shared by the server's command line (:mod:`nipflow_llm_server.server.cli`), ``nipflow api-server
stop`` (:mod:`nipflow_llm_server.server.control`) and the launcher of auto-started servers
(:mod:`nipflow_llm_server.launcher`).
"""

from __future__ import annotations

import json
from pathlib import Path

DEFAULT_PORT = 8765
SERVER_FILE = "server.json"
LOCK_FILE = "server.lock"
EXIT_LOCKED = 3
EXIT_USAGE = 2


def default_data_dir() -> Path:
    """``<data dir>/api_server``: the data directory of :func:`nip_core.settings.default_data_dir`."""
    from nip_core.settings import default_data_dir as data_root

    return Path(data_root()) / "api_server"


def read_server_file(data_dir: Path) -> dict | None:
    """The ``server.json`` record of a data directory, if readable."""
    try:
        return json.loads((Path(data_dir) / SERVER_FILE).read_text())
    except (OSError, ValueError):
        return None
