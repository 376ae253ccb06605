"""One Prefect task per pure-text stage, each a thin call to ``trainer.run_stage(stage)``.

A stage's result (the small JSON summary ``run_stage`` returns) is persisted in the run
store under the key ``(run_id, params_hash, iteration, stage)``; see
:mod:`tasks.persistence`. Task runs are named ``sample_rollouts[it=3]``.

Before executing, a task re-reads the trainer state from the run store: another process
may have advanced it (a race, or a crash between writing the state and persisting the
result). A stage the state shows as already done is not executed again; its summary is
rebuilt from the state.
"""

from __future__ import annotations

from typing import Any

from prefect import Task, task

from tasks.persistence import task_options_for

try:  # the pure-text trainers' stage table, when present
    from nip_core.trainers.stages import STAGE_ORDER
except ImportError:  # pragma: no cover - until the pure-text trainers land
    STAGE_ORDER = ("sample_rollouts", "log_stats", "test_during_training", "create_fine_tune_jobs",
                   "await_fine_tune_jobs", "test", "done")

STAGES: tuple[str, ...] = tuple(s for s in STAGE_ORDER if s != "done")


def refresh_state(trainer: Any) -> None:
    """Reload the trainer's state from the run store (no-op without a stored state)."""
    run = getattr(trainer, "run", None)
    if run is not None and run.has_state():
        trainer.state = run.load_state(trainer.State)


def stage_position(iteration: int, stage: str) -> tuple[int, int]:
    """Order of stages: by iteration, then by the stage diagram (``done`` last)."""
    return (iteration, STAGE_ORDER.index(stage))


def initial_position(trainer: Any) -> tuple[int, str]:
    """Where a fresh run of ``trainer`` starts in the stage diagram."""
    fresh = trainer.State()
    return fresh.iteration, getattr(fresh, "train_loop_stage", STAGES[0])


def execute_stage(trainer: Any, stage: str, iteration: int) -> dict[str, Any]:
    """Run ``stage`` of ``iteration`` unless the stored state shows it done.

    Returns the stage summary (``iteration``, ``stage``, ``next_iteration``,
    ``next_stage`` and optional ``metrics``/``jobs``).
    """
    refresh_state(trainer)
    current = trainer.next_stage()
    if stage_position(*current) > stage_position(iteration, stage):
        stored = getattr(trainer, "stored_stage_summary", None)
        summary = (stored(iteration, stage) if callable(stored) else None) or {
            "iteration": iteration, "stage": stage, "next_iteration": current[0], "next_stage": current[1]}
        return {**summary, "recovered_from_state": True}
    # A stage ahead of the state is refused by run_stage (StageOrderError).
    summary = dict(trainer.run_stage(stage))
    summary.setdefault("iteration", iteration)
    summary.setdefault("stage", stage)
    if "next_stage" not in summary:
        summary["next_iteration"], summary["next_stage"] = trainer.next_stage()
    return summary


def _make_stage_task(stage: str) -> Task:
    def run(trainer: Any, iteration: int) -> dict[str, Any]:
        return execute_stage(trainer, stage, iteration)

    run.__name__ = stage
    run.__qualname__ = stage
    run.__doc__ = f"The ``{stage}`` stage of one iteration (thin call into nip_core)."
    return task(run, name=stage, task_run_name=f"{stage}[it={{iteration}}]",
                retries=0)


STAGE_TASKS: dict[str, Task] = {stage: _make_stage_task(stage) for stage in STAGES}
sample_rollouts = STAGE_TASKS["sample_rollouts"]
log_stats = STAGE_TASKS["log_stats"]
test_during_training = STAGE_TASKS["test_during_training"]
create_fine_tune_jobs = STAGE_TASKS["create_fine_tune_jobs"]
await_fine_tune_jobs = STAGE_TASKS["await_fine_tune_jobs"]
test = STAGE_TASKS["test"]


def _stage_key(stage: str):
    return lambda inputs: (f"it{inputs['iteration']}", stage)


def run_stage_task(trainer: Any, stage: str, iteration: int, *, return_state: bool = False):
    """Call the task of ``stage`` for ``trainer`` with its run-keyed cache and storage.

    Must be called inside a flow run. With ``return_state=True`` the Prefect state is
    returned (``state.name == "Cached"`` when the stage was not executed).
    """
    bound = STAGE_TASKS[stage].with_options(**task_options_for(trainer, _stage_key(stage)))
    return bound(trainer, iteration, return_state=return_state)
