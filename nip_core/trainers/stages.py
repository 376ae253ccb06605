"""The stage machine of the pure-text trainers, defined once.

``STAGE_ORDER`` lists the stages; :data:`STAGE_FUNCTIONS` maps each stage to the
trainer method that runs it and returns the next ``(iteration, stage)``. Both
``PureTextRlTrainer.train`` and the Prefect flow (``tasks/stages.py``) iterate it::

    sample_rollouts -> log_stats -> test_during_training -> create_fine_tune_jobs
        -> await_fine_tune_jobs -> (next iteration) ... -> test -> done

On the last iteration ``test_during_training`` goes straight to ``test`` (no fine-tuning
after the last rollouts).
"""

from __future__ import annotations

from nip_core.errors import NipflowError

STAGE_ORDER: tuple[str, ...] = ("sample_rollouts", "log_stats", "test_during_training",
                                "create_fine_tune_jobs", "await_fine_tune_jobs", "test", "done")

STAGE_FUNCTIONS: dict[str, str] = {
    "sample_rollouts": "_stage_sample_rollouts",
    "log_stats": "_stage_log_stats",
    "test_during_training": "_stage_test_during_training",
    "create_fine_tune_jobs": "_stage_create_fine_tune_jobs_step",
    "await_fine_tune_jobs": "_stage_await_fine_tune_jobs",
    "test": "_stage_test",
}


class StageOrderError(NipflowError, RuntimeError):
    """A stage was asked for that is not the one the state is at."""

    def __init__(self, asked: str, iteration: int, current: str):
        super().__init__(f"stage '{asked}' requested but the state is at iteration {iteration}, stage '{current}'")


class FineTuneJobsPending(NipflowError, RuntimeError):
    """A non-blocking await found fine-tune jobs still pending or running."""

    def __init__(self, statuses: dict[str, str]):
        self.statuses = statuses
        super().__init__(f"fine-tune jobs still going: {statuses}")
