"""The pure-text stage machine inside the ``train_experiment`` flow run.

``train_experiment`` (:mod:`flows.experiment`) drives a pure-text trainer (EI, MALT) with
:func:`run_pure_text`, in its own flow run: a fine-tune wait may suspend it, which
Prefect only allows for a top-level flow run. The loop follows the stage diagram from
the start of the run::

    sample_rollouts -> log_stats -> test_during_training -> create_fine_tune_jobs
        -> await_fine_tune_jobs -> (next iteration) ... -> test -> done

Each stage is one task (:mod:`tasks.stages`) keyed by ``(run_id, params_hash,
iteration, stage)``; in a new flow run for the same run id, completed stages come back
``Cached`` from the run store and only the remaining ones execute. The tasks receive the
run's ``RunSpec`` and the iteration, not the flow's trainer (:mod:`tasks.trainers`).

Waiting for fine-tune jobs
--------------------------
* **poll** (local runs): the ``await_fine_tune_jobs`` task polls the jobs with backoff
  (``settings.fine_tune_poll_interval_s`` doubling up to ``fine_tune_poll_max_interval_s``).
* **suspend** (deployed runs): before the await stage the flow checks the jobs without
  blocking. While one is pending or running, the flow run suspends itself with the key
  ``await-<run_id>-<iteration>-<n>`` (``n`` counts the suspensions of that iteration, so
  a resume that comes too early suspends again instead of falling through); no process
  holds the wait. :func:`flows.watcher.fine_tune_watcher` resumes it when the jobs are
  finished. A failed or cancelled job is retried as a new attempt; once
  ``text_rl.fine_tune_max_attempts`` attempts ended badly the run fails listing every
  attempt's error (``FineTuneJobFailed``).
"""

from __future__ import annotations

from typing import Any

from prefect import flow_runs, get_run_logger
from prefect.runtime import deployment

from flows.form_fields import WaitMode
from flows.parameters import RunSpec
from nip_core.llm.job_status import TERMINAL_STATUSES
from tasks.stages import initial_position, refresh_state, run_stage_task
from tasks.trainers import keep_trainer

SUSPENSIONS_FILE = "orchestration/suspensions.json"


def should_suspend(wait_mode: WaitMode) -> bool:
    """Suspend on fine-tune waits when asked to, or (auto) when the run is deployed."""
    if wait_mode == "auto":
        return deployment.id is not None
    return wait_mode == "suspend"


def _next_suspension_key(run: Any, iteration: int) -> str:
    counts = run.read_json(SUSPENSIONS_FILE) if run.exists(SUSPENSIONS_FILE) else {}
    n = int(counts.get(str(iteration), 0))
    counts[str(iteration)] = n + 1
    run.write_json(SUSPENSIONS_FILE, counts)  # before suspending: keys are never reused
    return f"await-{run.run_id}-{iteration}-{n}"


def suspend_while_jobs_pending(trainer: Any, iteration: int) -> None:
    """Suspend the current flow run if a fine-tune job of ``iteration`` is still going."""
    statuses = trainer.poll_fine_tune_jobs()
    waiting = {g: s for g, s in statuses.items() if s not in TERMINAL_STATUSES}
    if not waiting or any(s in ("failed", "cancelled") for s in statuses.values()):
        return  # the await task finishes at once, or retries the failed job (FineTuneJobFailed when out of attempts)
    key = _next_suspension_key(trainer.run, iteration)
    get_run_logger().info("run %s iteration %d: fine-tune jobs %s still going; suspending (%s)",
                          trainer.run.run_id, iteration, waiting, key)
    timeout = trainer.settings.fine_tune_wait_timeout_s
    flow_runs.suspend_flow_run(key=key, timeout=int(timeout) if timeout else None)


def drive_stages(trainer: Any, spec: RunSpec | None = None, *, suspend: bool = False) -> list[dict[str, Any]]:
    """Run the stage machine of ``trainer`` to ``done`` inside the current flow run.

    The stage tasks receive ``spec`` (default: :meth:`RunSpec.for_trainer` of ``trainer``),
    and use ``trainer`` itself only because this function keeps it for them
    (:func:`tasks.trainers.keep_trainer`, an optimisation).
    Returns the summaries of all stages (cached ones included), in order.
    """
    if spec is None:
        spec = RunSpec.for_trainer(trainer)
    keep_trainer(spec, trainer)
    summaries: list[dict[str, Any]] = []
    iteration, stage = initial_position(trainer)
    while stage != "done":
        if suspend and stage == "await_fine_tune_jobs":
            refresh_state(trainer)
            if tuple(trainer.next_stage()) == (iteration, stage):  # not done yet
                suspend_while_jobs_pending(trainer, iteration)
        summary = run_stage_task(spec, stage, iteration)
        summaries.append(summary)
        iteration, stage = summary["next_iteration"], summary["next_stage"]
    refresh_state(trainer)
    return summaries


def run_pure_text(trainer: Any, wait_mode: WaitMode) -> dict[str, Any]:
    """Drive the stage machine to ``done`` (the caller publishes the result card)."""
    summaries = drive_stages(trainer, suspend=should_suspend(wait_mode))
    return {"run_id": trainer.run.run_id, "iteration": int(trainer.state.iteration),
            "stages": len(summaries), "location": trainer.run.location}
