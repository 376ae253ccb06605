"""OpenAI access for text agents: the client factory and the local OpenAI-compatible server.

See ``nip_core/llm/README.md`` for the local server and its model family. The names
below are imported lazily, so that the server process (a subpackage) does not pay for
importing the ``openai`` client.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LOCAL_PLACEHOLDER_KEY": "nip_core.llm.client",
    "is_local_url": "nip_core.llm.client",
    "make_openai_client": "nip_core.llm.client",
    "LocalServerError": "nip_core.llm.errors",
    "MissingApiKeyError": "nip_core.llm.errors",
    "LocalApiServer": "nip_core.llm.launcher",
    "ensure_local_server": "nip_core.llm.launcher",
    "local_api_server": "nip_core.llm.testing",
    "FaultConfig": "nip_core.llm.server.faults",
    "FaultRule": "nip_core.llm.server.faults",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'nip_core.llm' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
