"""Reading a run's files from its directory as a reader does (tests that look at the files directly).

After a driver took a run over from one that never released it (a SIGKILL, a lost worker), the
run's mutable files carry an epoch tag (``state.g0000000003.json``): the file to read is the
newest version, which :func:`nip_core.runs.fencing.current_file` names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nip_core.runs.fencing import current_file


def run_file(run_dir: Path | str, rel: str) -> Path:
    """The file a reader reads for ``rel`` of the local run at ``run_dir``."""
    return Path(current_file(str(run_dir), rel))


def run_text(location: Path | str, rel: str) -> str:
    """The text of ``rel`` of the run at ``location`` (a local path or an ``s3://`` URL), newest version."""
    import fsspec

    with fsspec.open(current_file(str(location), rel), "rt") as f:
        return f.read()


def run_json(run_dir: Path | str, rel: str) -> Any:
    """The JSON content of ``rel`` of the local run at ``run_dir`` (its newest version)."""
    return json.loads(run_file(run_dir, rel).read_text())
