"""The stage functions of the pure-text trainers, one per :class:`Stage` (:data:`STAGES`).

A stage function takes the trainer, does the stage's work (through the trainer's hooks,
so subclasses customise it there) and returns what the stage produced, merged into the
stage summary: ``metrics``, ``sampling_seconds``, ``jobs`` or ``trained_tokens``/``fine_tune_seconds``. It never decides where the
run goes next: :meth:`PureTextRlTrainer.run_stage` asks
:func:`nip_core.trainers.stage_machine.next_stage` after the stage function returned.

=======================  ==========================================================
stage                    work
=======================  ==========================================================
sample_rollouts          record the models; sample and save the training rollouts
                         (rerun: load the base run's models of the iteration instead)
log_stats                log the training statistics of the iteration's rollouts
test_during_training     test loop, where the test scheme asks for it (not after
                         the last iteration: that is the ``test`` stage)
create_fine_tune_jobs    ``trainer._stage_create_fine_tune_jobs(rollouts)``
await_fine_tune_jobs     wait for the jobs, then switch to the fine-tuned models
test                     test loop on the final models (those of iteration N-1),
                         where the test scheme asks for it
=======================  ==========================================================
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from nip_core.trainers.fine_tune_waiter import FineTuneJobsPending
from nip_core.trainers.stage_machine import STAGE_ORDER, Stage, StageOrderError

if TYPE_CHECKING:
    from nip_core.trainers.pure_text_base import PureTextRlTrainer

__all__ = ["FineTuneJobsPending", "STAGES", "STAGE_ORDER", "Stage", "StageOrderError"]

StageFunction = Callable[["PureTextRlTrainer"], dict[str, Any]]


def sample_rollouts(trainer: "PureTextRlTrainer") -> dict[str, Any]:
    """Sample (or, after an interrupted attempt, reload) the iteration's training rollouts.

    The summary has the wall time of the sampling (``sampling_seconds``; none when reloaded).
    """
    i = trainer.state.iteration
    trainer.logger.info("[%d/%d] Iteration begins", i + 1, trainer.num_iterations)
    models = lambda: {n: g.model_name for n, g in trainer.groups.items()}  # noqa: E731
    if trainer.base_run is not None:
        if trainer.base_run.load_into(trainer.groups, i):
            trainer.state.base_run_state_artifact_version = i
            trainer.records.record_models(i, models())
        else:
            trainer.logger.info("base run '%s' has no iteration %d: rerun complete", trainer.base_run.run_id, i)
        return {}
    trainer.records.record_models(i, models())
    name = str(i)
    out: dict[str, Any] = {}
    if trainer.records.has_rollouts(name):
        rollouts = trainer.records.reuse_rollouts(name)  # written by an interrupted attempt: never rewrite
    else:
        began = time.monotonic()
        rollouts = trainer._sample_rollouts(trainer.scenario.train_environment, i, use_tqdm=True)
        out["sampling_seconds"] = round(time.monotonic() - began, 3)
        trainer.reach_point(i, Stage.SAMPLE_ROLLOUTS.value, "before_save")
        trainer.records.save_rollouts(name, rollouts)
    trainer.records.keep(name, rollouts)
    return out


def log_stats(trainer: "PureTextRlTrainer") -> dict[str, Any]:
    """Log the statistics of the iteration's training rollouts (the trainer's ``_get_log_stats``)."""
    i = trainer.state.iteration
    rollouts = trainer.records.rollouts(str(i))
    stats = dict(trainer._get_log_stats(rollouts, train=True))
    stats["tokens_used"] = float(trainer.state.tokens_used)
    stats["fine_tune_trained_tokens"] = float(trainer.state.last_trained_tokens)
    trainer.log_stats(stats, i)
    return {"metrics": stats}


def test_during_training(trainer: "PureTextRlTrainer") -> dict[str, Any]:
    """The test loop of an iteration before the last one, if the test scheme asks for it."""
    i = trainer.state.iteration
    if i < trainer.num_iterations - 1 and trainer.should_test(i):
        return {"metrics": trainer.run_test_loop_at(i)}
    return {}


def create_fine_tune_jobs(trainer: "PureTextRlTrainer") -> dict[str, Any]:
    """Create the iteration's jobs with the trainer's ``_stage_create_fine_tune_jobs`` hook.

    The rollouts are the iteration's, or those of every iteration so far with
    ``text_rl.fine_tune_on_all_previous_rollouts``. Every group's job of the previous
    iteration is forgotten first, so a group the hook creates no job for is not waited on.
    """
    i = trainer.state.iteration
    its = range(i + 1) if trainer.hyper_params.text_rl.fine_tune_on_all_previous_rollouts else [i]
    rollouts = [r for it in its for r in (trainer.records.rollouts(str(it)) if it == i
                                          else trainer.records.load_rollouts(str(it)))]
    for g in trainer.groups.values():
        g.state = g.state.model_copy(update={"fine_tune_job_id": None, "fine_tune_attempt": 1, "last_status": None})
    jobs = trainer._stage_create_fine_tune_jobs(rollouts)
    if jobs is None:  # nip's form: the hook called the groups' job methods and returns nothing
        jobs = {n: g.state.fine_tune_job_id for n, g in trainer.groups.items() if g.state.fine_tune_job_id}
    return {"jobs": dict(jobs)}


def await_fine_tune_jobs(trainer: "PureTextRlTrainer") -> dict[str, Any]:
    """Wait for the jobs, then every group that had one uses its fine-tuned model.

    The summary has each group's trained tokens and the wall time of its job
    (``fine_tune_seconds``: from the job's creation to its end, by the API's clock).
    """
    trainer.run_await_stage(block=True)
    trained, seconds = {}, {}
    for name, g in trainer.groups_with_jobs().items():
        trained[name] = g.trained_tokens()
        took = g.job_seconds()
        if took is not None:
            seconds[name] = took
        g.switch_to_next_model()
    trainer.state.last_trained_tokens = sum(trained.values())
    return {"trained_tokens": trained, "fine_tune_seconds": seconds}


def test(trainer: "PureTextRlTrainer") -> dict[str, Any]:
    """The test loop on the final models, if the test scheme asks for it; then training is over.

    The final models are those of iteration ``N - 1`` (no fine-tuning follows the last
    iteration); a rerun that stopped early, its base run never having reached iteration
    ``N - 1``, has none to test.
    """
    final = trainer.num_iterations - 1
    reached = trainer.base_run is None or trainer.state.base_run_state_artifact_version == final
    out = {"metrics": trainer.run_test_loop_at(final)} if reached and trainer.should_test(final) else {}
    trainer.logger.info("Training complete.")
    return out


#: Stage -> the function that runs it (``done`` has none).
STAGES: dict[Stage, StageFunction] = {
    Stage.SAMPLE_ROLLOUTS: sample_rollouts,
    Stage.LOG_STATS: log_stats,
    Stage.TEST_DURING_TRAINING: test_during_training,
    Stage.CREATE_FINE_TUNE_JOBS: create_fine_tune_jobs,
    Stage.AWAIT_FINE_TUNE_JOBS: await_fine_tune_jobs,
    Stage.TEST: test,
}
