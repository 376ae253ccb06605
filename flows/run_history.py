"""Which runs a flow finished, and warm starts from them.

A run that a flow finished successfully is marked in its ``metadata.json``
(``completed_by_flow``, ``experiment``, see :func:`mark_completed`);
:func:`latest_successful_run` finds the newest such run of an experiment, and
:func:`apply_warm_start` prepares a new run to start from its final models. The
``scheduled_retraining`` flow (:mod:`flows.retrain`) puts the two together; the entry
flow (:mod:`flows.experiment`) marks the runs it finishes and applies the warm start its
parameters ask for. This module imports no other flow module.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any, Optional

from prefect import get_run_logger
from prefect.exceptions import MissingContextError

from nip_core.parameters import HyperParameters
from nip_core.runs import RunStore
from nip_core.trainers.warm_start import WarmStartError, prepare_warm_start


def experiment_name(hp: HyperParameters) -> str:
    """``<scenario>.<trainer>.<protocol>.<dataset>``: the experiment a run belongs to."""
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
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)
