"""Stat loggers: where per-iteration metrics go (run store, W&B, both, nowhere)."""

from __future__ import annotations

import logging
import math
from typing import Any

log = logging.getLogger(__name__)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class StatLogger:
    """Base class: ``log(stats, step, kind)``; ``kind`` is "train" or "test"."""

    def log(self, stats: dict[str, Any], step: int | None = None, kind: str = "train") -> None:
        raise NotImplementedError

    def log_artifact(self, name: str, artifact_type: str, paths: list[str]) -> None:
        """Record files as a versioned artifact (W&B); other loggers ignore it."""

    def close(self) -> None:
        pass


class DummyStatLogger(StatLogger):
    def log(self, stats, step=None, kind="train") -> None:
        pass


class RunStoreStatLogger(StatLogger):
    """Appends one line per (kind, iteration) to the run's ``metrics.jsonl``; never twice."""

    def __init__(self, run):
        self.run = run

    def log(self, stats, step=None, kind="train") -> None:
        if step is None:
            return
        clean = {k: _jsonable(v) for k, v in stats.items()}
        self.run.append_metrics(int(step), {"kind": kind, **clean})


class CompositeStatLogger(StatLogger):
    def __init__(self, *loggers: StatLogger):
        self.loggers = [lg for lg in loggers if lg is not None]

    def log(self, stats, step=None, kind="train") -> None:
        for lg in self.loggers:
            lg.log(stats, step=step, kind=kind)

    def log_artifact(self, name, artifact_type, paths) -> None:
        for lg in self.loggers:
            lg.log_artifact(name, artifact_type, paths)

    def close(self) -> None:
        for lg in self.loggers:
            lg.close()
