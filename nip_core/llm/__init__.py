"""OpenAI access for text agents: the client factory, fine-tuning capabilities, remote objects.

The local OpenAI-compatible server is not part of the domain library: it is the sibling
package ``nipflow_llm_server`` (see its README), found through an entry point when no API
is configured (:mod:`nip_core.llm.local_server`). The names below are imported lazily.
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
    "local_server_url": "nip_core.llm.local_server",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'nip_core.llm' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
