"""What a run shows in the Prefect UI: progress, a metrics table, a markdown summary.

:class:`PrefectHooks` is a :class:`~nip_core.trainers.TrainerHooks` subclass; the trainer
calls it without knowing about Prefect. Artifact keys are derived from the run id
(lower-case letters, digits and dashes, as Prefect requires), so each run has its own
progress bar and table, and every update is a new version in the artifact history.
"""

from __future__ import annotations

import logging
import math
import re
import time
from typing import Any

from nip_core.trainers import TrainerHooks

log = logging.getLogger(__name__)


def artifact_key(run_id: str, kind: str) -> str:
    """A valid Prefect artifact key: ``artifact_key("GI_run.1", "metrics") == "gi-run-1-metrics"``."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{run_id}-{kind}".lower()).strip("-")


def _in_run_context() -> bool:
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return str(value)


class PrefectHooks(TrainerHooks):
    """Mirror trainer progress and metrics into Prefect artifacts of the current run.

    Outside a flow run every method does nothing, so a trainer built with these hooks
    still runs with ``train()``.
    """

    def __init__(self, run_id: str, total_iterations: int, min_interval_s: float = 5.0):
        self.run_id = run_id
        self.total_iterations = max(int(total_iterations), 1)
        self.min_interval_s = min_interval_s
        self.rows: list[dict[str, Any]] = []
        self._progress_id = None
        self._last_publish = float("-inf")
        self._published_rows = 0

    def _set_progress(self, percent: float) -> None:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        percent = float(min(max(percent, 0.0), 100.0))
        if self._progress_id is None:
            self._progress_id = create_progress_artifact(
                progress=percent, key=artifact_key(self.run_id, "progress"),
                description=f"iterations done of run {self.run_id}")
        else:
            update_progress_artifact(artifact_id=self._progress_id, progress=percent)

    def on_iteration_end(self, iteration: int, metrics: dict[str, Any]) -> None:
        self.rows.append({"iteration": iteration, **{k: _jsonable(v) for k, v in metrics.items()}})
        # Each artifact version is an API call carrying the whole table: publish at most
        # every ``min_interval_s`` (and at the end, see ``flush``) so short iterations stay cheap.
        if time.monotonic() - self._last_publish >= self.min_interval_s:
            self.flush()

    def flush(self) -> None:
        """Publish the progress and metrics table now (if there are new rows)."""
        if not _in_run_context() or len(self.rows) == self._published_rows:
            return
        self._last_publish = time.monotonic()
        try:
            from prefect.artifacts import create_table_artifact

            self._set_progress(100.0 * (self.rows[-1]["iteration"] + 1) / self.total_iterations)
            create_table_artifact(table=self.rows, key=artifact_key(self.run_id, "metrics"),
                                  description=f"metrics per iteration of run {self.run_id}")
            self._published_rows = len(self.rows)
        except Exception as e:  # noqa: BLE001 - observability must never stop training
            log.warning("could not update Prefect artifacts for run %s: %s", self.run_id, e)

    def on_stage_end(self, stage: str, iteration: int) -> None:
        if stage == "test" and _in_run_context():
            try:
                self._set_progress(100.0 * (iteration + 1) / self.total_iterations)
            except Exception as e:  # noqa: BLE001
                log.warning("could not update Prefect progress for run %s: %s", self.run_id, e)


def write_summary(trainer: Any, summaries: list[dict[str, Any]] | None = None) -> str:
    """Create the end-of-run markdown artifact and return its text.

    The same summary as ``nipflow report`` (final accuracy and reward per agent), plus the
    fine-tune jobs created with their trained tokens, and where the run store is.
    """
    if isinstance(getattr(trainer, "hooks", None), PrefectHooks):
        trainer.hooks.flush()
    from nip_core.logging.report import summarise, summary_markdown

    run = trainer.run
    lines = [summary_markdown(summarise(run)["summary"]),
             f"- params hash: `{run.params_hash}`",
             f"- iterations done: {int(trainer.state.iteration)}",
             f"- run store: `{run.location}`", ""]
    jobs = [(s.get("iteration"), g, j) for s in (summaries or []) for g, j in (s.get("jobs") or {}).items()]
    if jobs:
        lines += ["## Fine-tune jobs", "", "| iteration | group | job | trained tokens |", "|---|---|---|---|"]
        tokens = {}
        for s in summaries or []:
            tokens.update({(s.get("iteration"), g): t for g, t in (s.get("trained_tokens") or {}).items()})
        lines += [f"| {it} | {g} | `{j}` | {tokens.get((it, g), '')} |" for it, g, j in jobs]
        lines.append("")
    text = "\n".join(lines)
    if _in_run_context():
        try:
            from prefect.artifacts import create_markdown_artifact

            create_markdown_artifact(markdown=text, key=artifact_key(run.run_id, "summary"),
                                     description=f"summary of run {run.run_id}")
        except Exception as e:  # noqa: BLE001
            log.warning("could not create the Prefect summary for run %s: %s", run.run_id, e)
    return text
