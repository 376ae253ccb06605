"""The error of graph-isomorphism data files (kept apart from the readers, which import torch)."""

from __future__ import annotations

import os
from pathlib import Path


class GraphIsomorphismDataError(ValueError):
    """A raw graph-isomorphism file is missing, unreadable or malformed."""

    def __init__(self, path: str | os.PathLike | None, message: str):
        self.path = None if path is None else Path(path)
        where = f"{self.path}: " if self.path is not None else ""
        super().__init__(where + message)
