"""Stat logging (run store and W&B) and progress."""

from __future__ import annotations

from nip_core.logging.stat_logger import (
    CompositeStatLogger,
    DummyStatLogger,
    RunStoreStatLogger,
    StatLogger,
)


def build_stat_logger(hyper_params, settings, run) -> StatLogger:
    """The default logger: the run's ``metrics.jsonl`` plus W&B when enabled (none for a ``NullRun``)."""
    if run is None or not run.persistent or settings.test_run:
        return DummyStatLogger()
    loggers: list[StatLogger] = [RunStoreStatLogger(run)]
    if settings.use_wandb and settings.wandb_mode != "disabled":
        try:
            from nip_core.logging.wandb_logger import WandbStatLogger
        except ModuleNotFoundError:
            WandbStatLogger = None  # noqa: N806
        if WandbStatLogger is not None:
            loggers.append(WandbStatLogger.for_run(hyper_params, settings, run))
    return CompositeStatLogger(*loggers)


__all__ = ["CompositeStatLogger", "DummyStatLogger", "RunStoreStatLogger", "StatLogger",
           "build_stat_logger"]
