"""``fine_tune_watcher``: resume suspended training runs whose fine-tune jobs finished.

A deployed pure-text run suspends itself while its fine-tune jobs run (see
:mod:`flows.pure_text`). This flow, deployed with an interval schedule, looks at every
suspended run of the training flows, opens its run store, polls the jobs without
blocking, and resumes the run when no job is pending or running any more. A failed or
cancelled job also resumes it: the await stage then fails the run with the job's error.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from nip_core.agents.pure_text import TERMINAL_STATUSES

TRAINING_FLOWS = ("train_experiment", "scheduled_retraining")


def suspended_training_runs(client) -> list[Any]:
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateName,
    )

    return client.read_flow_runs(
        flow_filter=FlowFilter(name=FlowFilterName(any_=list(TRAINING_FLOWS))),
        flow_run_filter=FlowRunFilter(state=FlowRunFilterState(name=FlowRunFilterStateName(any_=["Suspended"]))),
    )


def jobs_finished(parameters: dict[str, Any], flow_run_id: str | None = None) -> tuple[bool, dict[str, str]]:
    """Whether the suspended run described by its flow ``parameters`` can go on."""
    from flows.experiment import build_flow_trainer
    from flows.parameters import ExperimentParameters

    params = ExperimentParameters.model_validate(parameters["parameters"])
    hyper_params = params.hyper_params()
    trainer = build_flow_trainer(hyper_params, params.settings(hyper_params, flow_run_id))
    try:
        statuses = dict(trainer.poll_fine_tune_jobs())
    finally:
        trainer.close()
    return all(s in TERMINAL_STATUSES for s in statuses.values()), statuses


@flow(name="fine_tune_watcher")
def fine_tune_watcher() -> list[str]:
    """Resume each suspended training run whose jobs are done; return the resumed ids."""
    from prefect.client.orchestration import get_client
    from prefect.flow_runs import resume_flow_run

    log = get_run_logger()
    resumed = []
    with get_client(sync_client=True) as client:
        runs = suspended_training_runs(client)
    for run in runs:
        try:
            done, statuses = jobs_finished(run.parameters, str(run.id))
        except Exception as e:  # noqa: BLE001 - one broken run must not stop the others
            log.warning("flow run %s (%s): cannot check its jobs: %s", run.name, run.id, e)
            continue
        if done:
            log.info("flow run %s (%s): jobs %s finished; resuming", run.name, run.id, statuses)
            resume_flow_run(run.id)
            resumed.append(str(run.id))
    return resumed
