"""Scheduled retraining: a new run warm-started from the latest successful run.

A run that a flow finished successfully is marked in its ``metadata.json``
(``completed_by_flow``, ``experiment``). ``scheduled_retraining`` (a cron deployment)
finds the newest such run of the same experiment in the run store, copies its final
checkpoint and final fine-tuned model names into the new run's ``warm_start/`` folder
(recording ``metadata.warm_start_from``), and trains the new run, whose trainer starts
from those models (``metadata.warm_started``; see :mod:`nip_core.trainers.warm_start`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any, Optional

from prefect import flow, get_run_logger

from flows.parameters import ExperimentParameters
from nip_core.runs import RunStore
from nip_core.trainers.warm_start import WARM_START_DIR, WarmStartError, prepare_warm_start

__all__ = ["WARM_START_DIR", "WarmStartError", "apply_warm_start", "experiment_name", "latest_successful_run",
           "mark_completed", "scheduled_retraining"]


def experiment_name(parameters: ExperimentParameters) -> str:
    hp = parameters.hyper_params()
    return f"{hp.scenario}.{hp.trainer}.{hp.interaction_protocol}.{hp.dataset}"


def mark_completed(run: Any, experiment: str) -> None:
    """Record that a flow finished ``run`` successfully (used by :func:`latest_successful_run`)."""
    run.update_metadata(completed_by_flow=datetime.now(timezone.utc).isoformat(), experiment=experiment)


def latest_successful_run(runs_dir: str, experiment: str, exclude: str | None = None) -> Optional[str]:
    """The run id of the newest completed run of ``experiment`` in ``runs_dir`` (or None)."""
    store = RunStore(runs_dir)
    best: tuple[str, str] | None = None
    for run_id in store.list_runs():
        if run_id == exclude:
            continue
        run = store.open_run(run_id)
        if not run.exists("metadata.json"):
            continue
        meta = run.metadata()
        done = meta.get("completed_by_flow")
        if done and meta.get("experiment") == experiment and (best is None or done > best[0]):
            best = (done, run_id)
    return best[1] if best else None


def apply_warm_start(run: Any, source_run_id: str, runs_dir: str) -> list[str]:
    """Prepare ``run``'s ``warm_start/`` folder from ``source_run_id``'s final models.

    Copies the source's final checkpoint (TensorDict trainers) and its groups' final
    fine-tuned model names (``warm_start/models.json``, pure-text trainers), see
    :func:`nip_core.trainers.warm_start.prepare_warm_start`; the trainers load them before
    their first iteration. Does nothing for a run that already has a state (a resumed run
    keeps its own). Returns the copied checkpoint names.

    Raises
    ------
    WarmStartError
        If ``source_run_id`` is not in ``runs_dir``.
    """
    if run.has_state():
        return []
    store = RunStore(runs_dir)
    if not store.exists(source_run_id):
        raise WarmStartError(f"warm start: run '{source_run_id}' not found in {store.storage.url()}")
    record = prepare_warm_start(run, store.open_run(source_run_id))
    _flow_logger().info("run %s: warm start from run %s (checkpoint %s, models %s)", run.run_id, source_run_id,
                        record.get("checkpoint"), record.get("models"))
    return list(record.get("checkpoints", []))


def _flow_logger():
    """The flow run's logger inside a flow run, else this module's logger."""
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


@flow(name="scheduled_retraining", persist_result=True)
def scheduled_retraining(parameters: ExperimentParameters) -> dict[str, Any]:
    """Train a new run of ``parameters``' experiment from the latest successful run's models."""
    from flows.experiment import current_flow_run_id, train_experiment

    name = experiment_name(parameters)
    hp = parameters.hyper_params()
    settings = parameters.settings(hp, current_flow_run_id())
    previous = latest_successful_run(settings.runs_dir, name, exclude=settings.run_id)
    get_run_logger().info("retraining %s as run %s, warm start from %s", name, settings.run_id, previous)
    update = {"run_id": settings.run_id, "warm_start_from": previous}
    return train_experiment.fn(parameters.model_copy(update=update))
