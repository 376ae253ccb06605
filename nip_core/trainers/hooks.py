"""Callbacks through which an orchestrator observes a trainer (no dependency on it)."""

from __future__ import annotations

from typing import Any


class TrainerHooks:
    """No-op base: subclass and override what you need (the Prefect flows do)."""

    def on_progress(self, count: int, total: int, description: str) -> None:
        """A progress bar advanced."""

    def on_iteration_end(self, iteration: int, metrics: dict[str, Any]) -> None:
        """An iteration's metrics were logged."""

    def on_stage_end(self, stage: str, iteration: int) -> None:
        """A pure-text stage finished and the state was saved."""
