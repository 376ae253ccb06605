"""``fine_tune_watcher``: resume suspended training runs whose fine-tune jobs finished.

A deployed pure-text run suspends itself while its fine-tune jobs run (see
:mod:`flows.pure_text`). This flow, deployed with an interval schedule, looks at every
suspended run of the training flows, opens its run store, polls the jobs without
blocking, and resumes the run when no job is pending or running any more. A failed or
cancelled job also resumes it: the await stage then fails the run with the job's error.

Ticks may overlap (a slow tick, a backlog after an outage): each is idempotent, so the
deployment has no concurrency limit (docs/architecture.md#watcher-without-a-slot).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from prefect import flow, get_run_logger

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
    # Imported here: a tick with no suspended run (most ticks) loads Prefect only, not the
    # trainers' torch stack (seconds of CPU for every tick of an interval schedule).
    from flows.experiment import build_flow_trainer
    from flows.parameters import ExperimentParameters
    from nip_core.llm.job_status import TERMINAL_STATUSES

    spec = ExperimentParameters.from_flow_parameters(parameters).run_spec(flow_run_id)
    trainer = build_flow_trainer(spec.hyper_params(), spec.experiment_settings())
    try:
        statuses = dict(trainer.poll_fine_tune_jobs())
    finally:
        trainer.close()
    return all(s in TERMINAL_STATUSES for s in statuses.values()), statuses


@flow(name="fine_tune_watcher")
def fine_tune_watcher(max_lateness_s: float = 120.0) -> list[str]:
    """Resume each suspended training run whose jobs are done; return the resumed ids.

    Ticks need no exclusive slot: every step is idempotent (polling jobs reads; resuming a
    run that another tick resumed first is a no-op), so the deployment has no concurrency
    limit, which a tick killed with its host would hold for up to 300 s
    (docs/architecture.md#watcher-without-a-slot).

    Args:
        max_lateness_s: a tick that starts this many seconds or more after its scheduled
            time (a backlog of ticks after a worker outage) does nothing; 0 disables the check
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.responses import SetStateStatus
    from prefect.runtime import flow_run as this_run

    log = get_run_logger()
    scheduled = this_run.scheduled_start_time
    lateness = (datetime.now(timezone.utc) - scheduled).total_seconds() if scheduled else 0.0
    if max_lateness_s and lateness >= max_lateness_s:
        log.info("tick scheduled %.0f s ago (max_lateness_s=%s): skipped; a later tick does the work",
                 lateness, max_lateness_s)
        return []
    resumed = []
    with get_client(sync_client=True) as client:
        runs = suspended_training_runs(client)
        for run in runs:
            try:
                done, statuses = jobs_finished(run.parameters, str(run.id))
            except Exception as e:  # noqa: BLE001 - one broken run must not stop the others
                log.warning("flow run %s (%s): cannot check its jobs: %s", run.name, run.id, e)
                continue
            if not done:
                continue
            # The server resumes only a run that is still paused: of overlapping ticks, one does.
            response = client.resume_flow_run(run.id)
            if response.status != SetStateStatus.ACCEPT:
                log.info("flow run %s (%s): not resumed by this tick (%s)", run.name, run.id,
                         response.details.reason if response.details else response.status.value)
                continue
            log.info("flow run %s (%s): jobs %s finished; resuming", run.name, run.id, statuses)
            resumed.append(str(run.id))
    return resumed
