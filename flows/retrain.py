"""Scheduled retraining: a new run warm-started from the latest successful run.

A run that a flow finished successfully is marked in its ``metadata.json``
(``completed_by_flow``, ``experiment``). ``scheduled_retraining`` (a cron deployment)
finds the newest such run of the same experiment in the run store, copies its final
checkpoints into the new run's ``warm_start/`` folder (recording
``metadata.warm_start_from``), and trains the new run.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Optional

from prefect import flow, get_run_logger

from flows.parameters import ExperimentParameters
from nip_core.runs import RunStore

WARM_START_DIR = "warm_start"


class WarmStartError(RuntimeError):
    """The run to warm-start from cannot be used (names the run)."""


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
    """Copy ``source_run_id``'s checkpoints into ``run``'s ``warm_start/`` folder.

    Does nothing for a run that already has a state (a resumed run keeps its own).
    Returns the copied checkpoint names.
    """
    if run.has_state():
        return []
    store = RunStore(runs_dir)
    if not store.exists(source_run_id):
        raise WarmStartError(f"warm start: run '{source_run_id}' not found in {store.storage.url()}")
    source = store.open_run(source_run_id)
    names = source.list_checkpoints()
    for name in names:
        for suffix in (".pt", ".json"):
            rel = f"checkpoints/{name}{suffix}"
            if source.exists(rel):
                run.storage.write_bytes(f"{WARM_START_DIR}/{name}{suffix}", source.storage.read_bytes(rel))
    run.update_metadata(warm_start_from={"run_id": source_run_id, "location": source.location,
                                         "checkpoints": sorted(names)})
    return names


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
