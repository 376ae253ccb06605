"""What a run shows in the Prefect UI: progress, a metrics table, the result card.

:class:`PrefectHooks` is a :class:`~nip_core.trainers.TrainerHooks` subclass; the trainer
calls it without knowing about Prefect. Artifact keys are derived from the run id
(lower-case letters, digits and dashes, as Prefect requires), so each run has its own
progress bar and table, and every update is a new version in the artifact history.

The parent flow run of an experiment (``train_experiment``) carries, under the run's keys:

* ``<run>-progress``: one progress artifact per flow run, updated as iterations finish;
* ``<run>-metrics``: the metrics table of *all* iterations, read from the run store's
  ``metrics.jsonl`` (so it also holds what RL blocks trained in other processes and
  what earlier invocations trained), a new version after every block or throttled
  while a pure-text run trains;
* ``<run>-result-card``: the result card (:mod:`nip_core.logging.result_card`) at the
  end of every invocation, however it ended; ``<run>-summary`` only links to it.

An RL block's flow run publishes only its own rows, under ``<run>-block-<i>-metrics``
(:meth:`PrefectHooks.block_scope`), never under the parent's keys.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nip_core.trainers import TrainerHooks

log = logging.getLogger(__name__)


def artifact_key(run_id: str, kind: str) -> str:
    """A valid Prefect artifact key: ``artifact_key("GI_run.1", "metrics") == "gi-run-1-metrics"``."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{run_id}-{kind}".lower()).strip("-")


def _in_run_context() -> bool:
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def _current_flow_run_id() -> str | None:
    from prefect.context import FlowRunContext, TaskRunContext

    flow_ctx = FlowRunContext.get()
    if flow_ctx is not None and flow_ctx.flow_run is not None:
        return str(flow_ctx.flow_run.id)
    task_ctx = TaskRunContext.get()
    if task_ctx is not None and task_ctx.task_run.flow_run_id is not None:
        return str(task_ctx.task_run.flow_run_id)
    return None


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return str(value)


def _table_row(row: dict[str, Any]) -> dict[str, Any]:
    return {"iteration": row.get("iteration"),
            **{k: _jsonable(v) for k, v in row.items() if k not in ("iteration", "kind")}}


class PrefectHooks(TrainerHooks):
    """Mirror trainer progress and metrics into Prefect artifacts of the current run.

    Outside a flow run every method does nothing, so a trainer built with these hooks
    still runs with ``train()``. Once :meth:`attach` gave it the run, the metrics table
    is read from the run store (all iterations); before, it holds the rows seen here.
    """

    def __init__(self, run_id: str, total_iterations: int, min_interval_s: float = 5.0):
        self.run_id = run_id
        self.total_iterations = max(int(total_iterations), 1)
        self.min_interval_s = min_interval_s
        self.run: Any = None
        self.block: int | None = None
        self.rows: list[dict[str, Any]] = []
        self._block_rows: list[dict[str, Any]] = []
        self._progress: tuple[str | None, Any] | None = None  # (flow run id, artifact id)
        self._last_publish = float("-inf")
        self._published: tuple[str | None, int] | None = None  # (flow run id, rows) of the last table

    def attach(self, run: Any) -> None:
        """Read the metrics table from ``run``'s store from now on."""
        self.run = run

    @contextlib.contextmanager
    def block_scope(self, index: int) -> Iterator[None]:
        """Inside an RL block's flow run: publish only ``<run>-block-<index>-metrics``."""
        previous, self.block, self._block_rows = self.block, int(index), []
        try:
            yield
        finally:
            self.flush()
            self.block = previous

    # -- trainer callbacks -----------------------------------------------------------------

    def on_iteration_end(self, iteration: int, metrics: dict[str, Any]) -> None:
        row = {"iteration": iteration, **{k: _jsonable(v) for k, v in metrics.items()}}
        self.rows.append(row)
        if self.block is not None:
            self._block_rows.append(row)
        # Each artifact version is an API call carrying the whole table: publish at most
        # every ``min_interval_s`` (and at the end, see ``flush``) so short iterations stay cheap.
        if time.monotonic() - self._last_publish >= self.min_interval_s:
            self.flush()

    def on_stage_end(self, stage: str, iteration: int) -> None:
        if stage == "test" and self.block is None and _in_run_context():
            try:
                self._set_progress(100.0 * (iteration + 1) / self.total_iterations)
            except Exception as e:  # noqa: BLE001
                log.warning("could not update Prefect progress for run %s: %s", self.run_id, e)

    # -- publishing ------------------------------------------------------------------------

    def flush(self) -> None:
        """Publish the table (and progress) of the current scope now, if it has new rows."""
        if not _in_run_context():
            return
        self._last_publish = time.monotonic()
        try:
            if self.block is not None:
                self._publish_block()
            else:
                self.publish_run()
        except Exception as e:  # noqa: BLE001 - observability must never stop training
            log.warning("could not update Prefect artifacts for run %s: %s", self.run_id, e)

    def _publish_block(self) -> None:
        from prefect.artifacts import create_table_artifact

        if self._block_rows and self._published != ("block", len(self._block_rows)):
            create_table_artifact(table=self._block_rows, key=artifact_key(self.run_id, f"block-{self.block}-metrics"),
                                  description=f"metrics of RL block {self.block} of run {self.run_id}")
            self._published = ("block", len(self._block_rows))

    def publish_run(self, iterations_done: int | None = None) -> None:
        """Publish the run's full metrics table and its progress (parent flow run only).

        ``iterations_done`` sets the progress (default: one past the last row's iteration).
        Nothing is published when the table has not changed since the last call in this
        flow run.
        """
        from prefect.artifacts import create_table_artifact

        if self.run is not None:
            rows = [_table_row(r) for r in self.run.read_metrics() if r.get("kind", "train") == "train"]
        else:
            rows = list(self.rows)
        done = iterations_done if iterations_done is not None else (
            int(rows[-1]["iteration"]) + 1 if rows else 0)
        if done:
            self._set_progress(100.0 * done / self.total_iterations)
        here = _current_flow_run_id()
        if rows and self._published != (here, len(rows)):
            create_table_artifact(table=rows, key=artifact_key(self.run_id, "metrics"),
                                  description=f"metrics per iteration of run {self.run_id} (all iterations)")
            self._published = (here, len(rows))

    def _set_progress(self, percent: float) -> None:
        """One progress artifact per flow run: created on first use, updated after."""
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        percent = float(min(max(percent, 0.0), 100.0))
        here = _current_flow_run_id()
        key = artifact_key(self.run_id, "progress")
        if self._progress is None or self._progress[0] != here:
            # A flow run resumed in a new process (after a suspension) keeps its progress artifact.
            existing = _artifact_of(key, here)
            self._progress = (here, existing) if existing is not None else None
        if self._progress is None:
            artifact_id = create_progress_artifact(progress=percent, key=key,
                                                   description=f"iterations done of run {self.run_id}")
            self._progress = (here, artifact_id)
        else:
            update_progress_artifact(artifact_id=self._progress[1], progress=percent)


def _artifact_of(key: str, flow_run_id: str | None) -> Any:
    """The id of the newest artifact ``key`` of ``flow_run_id`` (None if it has none)."""
    if flow_run_id is None:
        return None
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return max(found, key=lambda a: a.created).id if found else None


# -- the result card ---------------------------------------------------------------------------


def prefect_ui_location(runs_dir: str, flow_run_id: str | None) -> str | None:
    """How to see this flow run: ``nipflow ui --runs-dir D`` when its Prefect history is the
    local one of the run store (``<runs_dir>/.prefect``), else the flow run's URL when the
    UI's address is known (``PREFECT_UI_URL``)."""
    from prefect.settings import PREFECT_HOME, PREFECT_UI_URL

    from nip_core.logging.result_card import local_ui_command
    from nip_core.runs.storage import is_url

    if not is_url(runs_dir):
        runs_path = Path(runs_dir).absolute()
        try:
            if Path(PREFECT_HOME.value()).absolute() == runs_path / ".prefect":
                return local_ui_command(str(runs_path))
        except (TypeError, ValueError):
            pass
    ui = PREFECT_UI_URL.value()
    if ui and flow_run_id:
        return f"{str(ui).rstrip('/')}/runs/flow-run/{flow_run_id}"
    return None


def _block_links(run_id: str, flow_run_id: str | None) -> list[str]:
    """Markdown lines listing the RL block flow runs under ``flow_run_id`` and their tables."""
    if flow_run_id is None:
        return []
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
    from prefect.settings import PREFECT_UI_URL

    with get_client(sync_client=True) as client:
        children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])))
    blocks = sorted((r for r in children if (r.name or "").startswith("rl-block")), key=lambda r: r.created)
    if not blocks:
        return []
    ui = PREFECT_UI_URL.value()
    lines = ["", "## RL blocks", "", "| block flow run | state | its metrics artifact |", "|---|---|---|"]
    for r in blocks:
        name = f"[{r.name}]({str(ui).rstrip('/')}/runs/flow-run/{r.id})" if ui else f"{r.name} (`{r.id}`)"
        index = re.match(r"rl-block-(\d+)", r.name or "")
        table = f"`{artifact_key(run_id, f'block-{index.group(1)}-metrics')}`" if index else ""
        lines.append(f"| {name} | {r.state.name if r.state else '?'} | {table} |")
    return lines


def publish_result_card(trainer: Any, status: str | None = None, message: str | None = None) -> str:
    """Create the result card artifact of ``trainer``'s run (and the summary link); return its markdown.

    The card is built from the run store alone (:func:`nip_core.logging.result_card.result_card`).
    """
    from nip_core.logging.result_card import result_card

    run = trainer.run
    card = result_card(run, status=status, message=message)
    text = card.to_markdown()
    if not _in_run_context():
        return text
    here = _current_flow_run_id()
    try:
        links = _block_links(run.run_id, here)
        text += "\n".join(links) + ("\n" if links else "")
    except Exception as e:  # noqa: BLE001 - links are a convenience
        log.warning("could not list the RL blocks of run %s: %s", run.run_id, e)
    try:
        from prefect.artifacts import create_markdown_artifact

        key = artifact_key(run.run_id, "result-card")
        create_markdown_artifact(markdown=text, key=key, description=f"result card of run {run.run_id}")
        create_markdown_artifact(
            markdown=f"# Summary of run `{run.run_id}`\n\nThe summary of this run is its result card: "
                     f"artifact `{key}` ({card.status}, {card.iterations_done}/{card.iterations_planned} "
                     "iterations).\n", key=artifact_key(run.run_id, "summary"),
            description=f"see {key}")
    except Exception as e:  # noqa: BLE001
        log.warning("could not create the Prefect result card for run %s: %s", run.run_id, e)
    return text


def outcome_of(error: BaseException) -> tuple[str, str | None]:
    """``(status, message)`` of an invocation that ended with ``error``."""
    from prefect.exceptions import Pause, TerminationSignal

    from nip_core.runs import invocations

    if isinstance(error, Pause):
        return "suspended", "waiting (suspended flow run); it resumes when its fine-tune jobs finish"
    if isinstance(error, TerminationSignal):  # Prefect's form of SIGTERM in a flow run: stopped, like Ctrl-C
        return "interrupted", f"stopped by {signal.Signals(error.signal).name}"
    return invocations.outcome_of(error)


def flow_recording(trainer: Any) -> dict[str, Any]:
    """How a flow run records itself around its work on ``trainer``'s run (holding its lease).

    The keyword arguments of :func:`flows.leases.driving` (and so of
    :func:`nip_core.runs.driving.driving_run`): the invocation is recorded as ``"flow"`` with
    the flow run and its UI location, its outcome read the Prefect way (a suspension is
    ``suspended``), and at the end — however the body ended — the state is reloaded from the
    run store, the final metrics table and the result card are published. Attaches the run to
    the trainer's :class:`PrefectHooks` (tables from the run store).
    """
    hooks = trainer.hooks if isinstance(getattr(trainer, "hooks", None), PrefectHooks) else None
    if hooks is not None:
        hooks.attach(trainer.run)
    flow_run_id = _current_flow_run_id()

    def publish() -> None:
        trainer.reload_state()  # the blocks may have trained in other processes
        if hooks is not None and _in_run_context():
            hooks.publish_run(int(trainer.state.iteration))
        publish_result_card(trainer)

    return {"record": "flow", "outcome_of": outcome_of, "after": publish,
            "details": {"flow_run_id": flow_run_id,
                        "prefect_ui": prefect_ui_location(str(trainer.settings.runs_dir), flow_run_id)}}
