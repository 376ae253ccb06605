"""The OpenAI-compatible API that text agents use when none is configured.

The domain library talks to an API and never starts a server itself. When neither
``settings.openai_base_url`` nor ``OPENAI_BASE_URL`` names one, it asks the installed
*local stand-in* for a server on a data directory: a callable ``(data_dir: Path) -> str``
(the base URL, ending in ``/v1``) registered under the entry-point group
:data:`ENTRY_POINT_GROUP`. nipflow's own stand-in is the sibling package
``nipflow_llm_server`` (``nipflow_llm_server.launcher:ensure_local_server``, declared in
``pyproject.toml``); another installed package may provide its own under another name.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

from nip_core.llm.errors import LocalServerError

ENTRY_POINT_GROUP = "nipflow.local_openai_server"
#: The stand-in used when several are installed.
DEFAULT_STAND_IN = "nipflow"


def local_server_url(data_dir: Path) -> str:
    """Base URL of a local OpenAI-compatible server keeping its state in ``data_dir``.

    Raises
    ------
    LocalServerError
        No stand-in is installed, or several are and none is :data:`DEFAULT_STAND_IN`; or the
        stand-in could not start its server.
    """
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if not found:
        raise LocalServerError(str(data_dir), "no OPENAI_BASE_URL is set and no local OpenAI-compatible server "
                               f"is installed (entry-point group '{ENTRY_POINT_GROUP}'; nipflow's own is "
                               "the package nipflow_llm_server: pip install -e . from the repository)")
    if len(found) > 1 and DEFAULT_STAND_IN not in found:
        raise LocalServerError(str(data_dir), f"several local OpenAI-compatible servers are installed "
                               f"({', '.join(sorted(found))}) and none is '{DEFAULT_STAND_IN}': set OPENAI_BASE_URL")
    entry = found.get(DEFAULT_STAND_IN) or next(iter(found.values()))
    return entry.load()(Path(data_dir))
